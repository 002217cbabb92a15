"""DeepseekV3 ``quantize``: modelopt PTQ of the routed experts to NVFP4 (modelopt's unified HF export),
the same calibration ``serve`` caches for the tiny model, written to the run's output directory."""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.engine.plan_section import EnginePlan, layers_with_scheme
from nvfp4stack.schemes import Scheme

QUANT_CFG = "NVFP4_EXPERTS_ONLY_CFG"


def bf16_expert_layers(plan: EnginePlan, config: dict) -> list[int]:
    """MoE layers whose routed experts the plan keeps BF16 (modelopt leaves them unquantized)."""
    n, first = config["num_hidden_layers"], config.get("first_k_dense_replace", 0)
    return [i for i in layers_with_scheme(plan, "routed_experts", Scheme.BF16, n) if first <= i < n]


def export_nvfp4(cfg, src: Path, out: Path, bf16_layers: list[int]) -> Path:
    """modelopt NVFP4 experts-only PTQ of ``src`` into ``out`` (atomic), layers ``bf16_layers`` left BF16."""
    from nvfp4stack.models.deepseek_v3.tiny import ROUTING_KEYS
    from nvfp4stack.quantize.modelopt_ptq import quantize_and_export

    q = cfg.quantize
    return quantize_and_export(src, out, QUANT_CFG, num_samples=q.calib_samples, max_len=q.calib_seq_len,
                               seed=q.seed, keep_config_keys=tuple(ROUTING_KEYS),
                               disable=tuple(f"*layers.{i}.mlp.experts*" for i in bf16_layers))


def run(cfg) -> int:
    import json

    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.families.resolve import model_dir

    q = cfg.quantize
    if q.method != "modelopt":
        raise ValueError(f"quantize.method={q.method!r}: model family 'deepseek_v3' quantizes with modelopt "
                         "only (the data-free cast reads a release's MXFP4 experts); valid: modelopt. Fix: "
                         "quantize.method=modelopt")
    src = Path(q.source).expanduser() if q.source else model_dir(cfg.model, cfg.cache_dir)
    if src is None or not (src / "config.json").exists():
        raise ValueError(f"quantize.source: expected a BF16 DeepseekV3 checkpoint directory, found {src}; set "
                         "quantize.source=DIR or model.path=DIR")
    out = Path(q.output_dir).expanduser() if q.output_dir else Path(cfg.run_dir) / "quantized"
    if out.exists():
        raise ValueError(f"quantize.output_dir={out}: exists; expected a new directory. Fix: remove it or set "
                         "quantize.output_dir=<new dir>")
    config = json.loads((src / "config.json").read_text())
    bf16 = bf16_expert_layers(engine_plan_for(cfg), config)
    if len(bf16) == config["num_hidden_layers"] - config.get("first_k_dense_replace", 0):
        raise ValueError("precision.routed_experts: the recipe's plan puts no routed expert in NVFP4, so "
                         "there is nothing to quantize; expected nvfp4 or nvfp4_w4a16. Fix: "
                         "precision=experts_nvfp4")
    keep = f" (layers {bf16} kept BF16 as planned)" if bf16 else ""
    print(f"[quantize] modelopt NVFP4 routed experts of {src}{keep} -> {out}", flush=True)
    export_nvfp4(cfg, src, out, bf16)
    print(f"quantize: wrote {out} (modelopt {QUANT_CFG}, {q.calib_samples} calibration texts). Next: "
          f"python main.py recipe={cfg.recipe} doctor checkpoint={out}; then "
          f"python main.py recipe={cfg.recipe} serve model.path={out}", flush=True)
    return 0
