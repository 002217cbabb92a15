"""The tiny Qwen3-MoE's checkpoints: the BF16 build, the NVFP4 export ``serve`` runs (cached), and
the ``quantize`` command (modelopt NVFP4 on the routed experts, modelopt's unified HF export)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from nvfp4stack.schemes import Scheme

FAMILY_NAME = "qwen3_moe"
FACTORY = "tiny_qwen3_moe"
MODELOPT_CONFIG = "NVFP4_EXPERTS_ONLY_CFG"   # routed experts only; attention, gate, embed, head stay BF16


def cache_dir(cfg) -> Path:
    return Path(cfg.cache_dir).expanduser() / FACTORY


def build_factory(cache_root: Path, source_format: str) -> Path:
    """``model.factory=tiny_qwen3_moe``: the seeded random BF16 build (cached)."""
    from nvfp4stack.models.qwen3_moe.tiny import ensure_tiny_qwen3_moe

    if source_format != "bf16":
        raise ValueError(f"model.source_format={source_format!r}: the tiny Qwen3-MoE is built in bf16 (Qwen's own "
                         "releases are BF16); set model.source_format=bf16")
    return ensure_tiny_qwen3_moe(Path(cache_root) / FACTORY)


def bf16_source(cfg) -> Path:
    """The BF16 checkpoint to quantize: quantize.source, a bf16 model.path, or the factory build."""
    if cfg.quantize.source:
        return Path(cfg.quantize.source).expanduser()
    if cfg.model.path:
        if cfg.model.source_format != "bf16":
            raise ValueError(f"model.path={cfg.model.path!r} is stored {cfg.model.source_format!r}; quantize "
                             "calibrates a BF16 Qwen3-MoE: set quantize.source=<BF16 checkpoint dir>")
        return Path(cfg.model.path).expanduser()
    if cfg.model.factory != FACTORY:
        raise ValueError(f"model.factory={cfg.model.factory!r}: expected {FACTORY} or a model.path for a Qwen3-MoE "
                         "BF16 checkpoint")
    return build_factory(Path(cfg.cache_dir).expanduser(), "bf16")


def _bf16_expert_layers(plan, num_layers: int) -> list[int]:
    from nvfp4stack.engine.plan_section import layers_with_scheme

    return layers_with_scheme(plan, "routed_experts", Scheme.BF16, num_layers)


def _export(src: Path, out: Path, q, bf16_layers: list[int]) -> None:
    from nvfp4stack.quantize.modelopt_ptq import quantize_and_export

    quantize_and_export(src, out, MODELOPT_CONFIG, num_samples=q.calib_samples, max_len=q.calib_seq_len,
                        seed=q.seed, disable=tuple(f"*layers.{i}.mlp.experts*" for i in bf16_layers))


def serve_checkpoint(cfg, plan, build: bool = True) -> Path | None:
    """The cached modelopt-NVFP4 export of the tiny model (built + quantized when absent).

    Routed experts the plan keeps BF16 (precision rules naming layers) are left unquantized by
    modelopt, whose export lists them under ``ignore``; a plan with every routed expert BF16 serves
    the BF16 build itself.
    """
    if cfg.model.factory != FACTORY or cfg.model.path:
        return None
    from nvfp4stack.models.qwen3_moe.tiny import TinyQwen3MoeSpec

    layers = TinyQwen3MoeSpec().num_hidden_layers
    bf16 = _bf16_expert_layers(plan, layers)
    root = cache_dir(cfg)
    if len(bf16) == layers:
        return build_factory(Path(cfg.cache_dir).expanduser(), "bf16") if build else root / "random"
    out = root / ("nvfp4" if not bf16 else "nvfp4-bf16-layers-" + "-".join(map(str, bf16)))
    if not build:
        return out
    src = build_factory(Path(cfg.cache_dir).expanduser(), "bf16")
    q = cfg.quantize
    stamp = out / "nvfp4stack_source.json"
    want = json.dumps({"spec": (src / "nvfp4stack_spec.json").read_text(), "calib_samples": q.calib_samples,
                       "calib_seq_len": q.calib_seq_len, "seed": q.seed, "bf16_expert_layers": bf16}, sort_keys=True)
    if not (stamp.exists() and stamp.read_text() == want):
        keep = f" (layers {bf16} kept BF16 as planned)" if bf16 else ""
        print(f"[serve] quantizing routed experts of {src} to NVFP4 with modelopt{keep} -> {out}", flush=True)
        _export(src, out, q, bf16)
        stamp.write_text(want)
    return out


def quantize(cfg) -> int:
    """``quantize``: modelopt NVFP4 of the routed experts, unified HF export, report in the run dir."""
    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.quantize.report import write_report

    q = cfg.quantize
    if q.method != "modelopt" or q.export_format != "hf_unified":
        raise ValueError(f"quantize.method={q.method!r}, quantize.export_format={q.export_format!r}: a Qwen3-MoE is "
                         "quantized from BF16 with modelopt into its unified HF export; set quantize.method=modelopt "
                         "quantize.export_format=hf_unified")
    src = bf16_source(cfg)
    run_dir = Path(cfg.run_dir).expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Path(q.output_dir).expanduser() if q.output_dir else run_dir / "quantized"
    layers = int(json.loads((src / "config.json").read_text())["num_hidden_layers"])
    bf16 = _bf16_expert_layers(engine_plan_for(cfg), layers)
    _export(src, out, q, bf16)
    report = write_report(run_dir, method=f"modelopt/{MODELOPT_CONFIG}", out_dir=out, before_dir=src,
                          reference_dir=src, extra={"bf16_expert_layers": bf16}, family=FAMILY_NAME)
    rel = report["weight_error_vs_bf16"].get("routed_experts", {}).get("rel_error")
    print(f"quantize: wrote {out}; routed-expert rel error vs BF16 = {rel}; bytes {report['bytes_before']:,} -> "
          f"{report['bytes_after']:,}; report in {run_dir}")
    return 0


def served_config(src_config: dict, groups: list) -> dict | None:
    """config.json of a ``convert`` output: with routed experts converted to NVFP4, the modelopt NVFP4
    quantization_config vLLM loads them with (group 16). Everything not stored NVFP4 is excluded, as
    modelopt's own export lists it: attention, router, embed, head, the dense MLP of non-MoE layers,
    and the routed experts of layers the plan keeps BF16. None (copy the source's) for other plans."""
    from nvfp4stack.models.qwen3_moe.spec import is_moe_layer

    experts = [g for g in groups if g.role == "routed_experts"]
    if not any(g.converter and g.target.is_nvfp4 for g in experts):
        return None
    layer = re.compile(r"^model\.layers\.(\d+)\.")
    nvfp4_layers = {int(layer.match(g.name).group(1)) for g in experts if g.target.is_nvfp4}
    ignore = ["lm_head", "model.embed_tokens"]
    for i in range(int(src_config["num_hidden_layers"])):
        ignore.append(f"model.layers.{i}.self_attn*")
        if not is_moe_layer(src_config, i):
            ignore.append(f"model.layers.{i}.mlp*")
            continue
        ignore.append(f"model.layers.{i}.mlp.gate")
        if i not in nvfp4_layers:
            ignore.append(f"model.layers.{i}.mlp.experts*")
    fp4 = {"dynamic": False, "group_size": 16, "num_bits": 4, "type": "float"}
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ignore,
             "config_groups": {"group_0": {"input_activations": fp4, "weights": fp4, "targets": ["Linear"]}}}
    return {**src_config, "quantization_config": quant}
