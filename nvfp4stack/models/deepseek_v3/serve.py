"""The checkpoint ``serve`` runs for the tiny DeepseekV3 factory: its cached modelopt-NVFP4 export."""
from __future__ import annotations

import json
from pathlib import Path

from nvfp4stack.engine.plan_section import EnginePlan


def tiny_v3_checkpoint(cfg, plan: EnginePlan, *, build: bool = True) -> Path:
    """Cached modelopt-NVFP4 export of the tiny DeepseekV3 (built + quantized when absent).

    Routed experts the plan keeps BF16 (precision rules naming layers) are left unquantized by
    modelopt, whose export lists them under ``ignore``: the checkpoint agrees with the plan. When
    the plan keeps every routed expert BF16 the BF16 build itself is served.
    """
    from nvfp4stack.models.deepseek_v3.quantize import bf16_expert_layers, export_nvfp4
    from nvfp4stack.models.deepseek_v3.tiny import TinyV3Spec, ensure_tiny_v3

    cache = Path(cfg.cache_dir).expanduser() / "tiny_v3"
    spec = TinyV3Spec()
    moe_layers = range(spec.first_k_dense_replace, spec.num_hidden_layers)
    bf16 = bf16_expert_layers(plan, {"num_hidden_layers": spec.num_hidden_layers,
                                     "first_k_dense_replace": spec.first_k_dense_replace})
    if len(bf16) == len(moe_layers):
        return ensure_tiny_v3(cache, spec) if build else cache / "bf16"
    out = cache / ("nvfp4" if not bf16 else "nvfp4-bf16-layers-" + "-".join(map(str, bf16)))
    if not build:
        return out
    src = ensure_tiny_v3(cache, spec)
    stamp = out / "nvfp4stack_source.json"
    want = json.dumps({"spec": (src / "nvfp4stack_spec.json").read_text(),
                       "calib_samples": cfg.quantize.calib_samples, "bf16_expert_layers": bf16,
                       "calib_seq_len": cfg.quantize.calib_seq_len, "seed": cfg.quantize.seed},
                      sort_keys=True)
    if not (stamp.exists() and stamp.read_text() == want):
        keep = f" (layers {bf16} kept BF16 as planned)" if bf16 else ""
        print(f"[serve] quantizing routed experts of {src} to NVFP4 with modelopt{keep} -> {out}", flush=True)
        export_nvfp4(cfg, src, out, bf16)
        stamp.write_text(want)
    return out
