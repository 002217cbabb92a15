"""End to end on the tiny DeepseekV3 (the embedded default): what ``serve`` serves vs its BF16 build.

The tiny DeepseekV3 model quantizes only its routed experts, with modelopt, and ``serve`` caches that export. So here the
reference is transformers' DeepseekV3 forward of the BF16 build (fp32 arithmetic) and the compared
model is the same forward carrying the served export's NVFP4 experts
(``tiny.reference_model``): W4A4 fake-quantizes each expert GEMM input with the export's
calibrated ``input_scale``, W4A16 keeps bf16 activations, and a plan with every routed expert BF16
compares the BF16 build with itself (the sanity row: KL 0, top-1 agreement 1).
"""
from __future__ import annotations

import copy
from pathlib import Path

from nvfp4stack.schemes import Scheme

_ROLE = "routed_experts"
_W4A4 = {Scheme.NVFP4: True, Scheme.NVFP4_W4A16: False}


def _routed_scheme(plan, num_layers: int, moe_layers: range) -> Scheme:
    """The one scheme the plan gives every MoE layer's routed experts (mixed plans are refused)."""
    from nvfp4stack.engine.plan_section import layers_with_scheme

    found = {s: [i for i in layers_with_scheme(plan, _ROLE, s, num_layers) if i in moe_layers]
             for s in (Scheme.BF16, *_W4A4)}
    used = [s for s, layers in found.items() if layers]
    if len(used) != 1 or len(found[used[0]]) != len(moe_layers):
        raise ValueError(f"eval.level=e2e on tiny_v3: precision.routed_experts must give every MoE layer "
                         f"({list(moe_layers)}) one of bf16, nvfp4, nvfp4_w4a16; found "
                         f"{ {s.value: v for s, v in found.items() if v} }; drop the per-layer precision.rules")
    others = {r: e["scheme"] for r, e in plan.roles.items()
              if r != _ROLE and e is not None and e["scheme"] not in (Scheme.BF16.value, Scheme.PASSTHROUGH.value)}
    if others:
        raise ValueError(f"eval.level=e2e on tiny_v3: only the routed experts are quantized on this model (what "
                         f"serve exports with modelopt); found {others}; set those precision keys to bf16")
    return used[0]


def tiny_v3_e2e(cfg, batches_for) -> tuple[dict, dict]:
    """(precision summary, e2e metrics) of the recipe's tiny_v3; ``batches_for(tokenizer)`` gives the
    evaluated prompts (the same as every family's harness uses)."""
    import torch
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.eval.e2e import compare_models
    from nvfp4stack.models.deepseek_v3.tiny import TinyV3Spec, ensure_tiny_v3, reference_model
    from nvfp4stack.models.deepseek_v3.serve import tiny_v3_checkpoint

    if cfg.model.factory != "tiny_v3" or cfg.model.path:
        raise ValueError(f"eval.level=e2e for model.family=deepseek_v3: expected model.factory=tiny_v3 (the trained "
                         f"embedded default) and no model.path, found model.factory={cfg.model.factory!r}, "
                         f"model.path={cfg.model.path!r}; use the default recipe")
    spec = TinyV3Spec()
    plan = engine_plan_for(cfg)
    scheme = _routed_scheme(plan, spec.num_hidden_layers, range(spec.first_k_dense_replace, spec.num_hidden_layers))
    served = Path(tiny_v3_checkpoint(cfg, plan))     # the export serve runs (the BF16 build for bf16 experts)
    bf16 = ensure_tiny_v3(Path(cfg.cache_dir).expanduser() / "tiny_v3", spec)   # cached: what the export came from
    ref = DeepseekV3ForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    if scheme is Scheme.BF16:
        quant = copy.deepcopy(ref)
    else:
        quant = reference_model(bf16, served, w4a4=_W4A4[scheme])
    batches = batches_for(AutoTokenizer.from_pretrained(bf16))
    precision = {_ROLE: scheme.value, "checkpoint": str(served)}
    return precision, compare_models(ref, quant, batches)


def fidelity(cfg, seed: int) -> dict:
    """``eval.level=e2e`` metrics of the recipe's tiny_v3."""
    from nvfp4stack.eval.prompts import eval_token_ids

    precision, e2e = tiny_v3_e2e(cfg, lambda tok: eval_token_ids(tok, cfg.eval.num_prompts, cfg.eval.max_tokens, seed))
    return {"precision": {k: v for k, v in precision.items() if k != "checkpoint"},
            "checkpoint": precision["checkpoint"], "e2e": e2e}
