"""Checkpoint doctor: is this checkpoint what the plan and vLLM's loader expect?

One pass over the headers (files, index, names, shapes, dtypes), one lazy pass over the values
(one tensor in memory at a time), the model family's own checks (its expected tensors and the
config.json fields vLLM reads) and, where vLLM is importable and the family has one, vLLM's own
load check. Nothing is written into the checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

from nvfp4stack.doctor.files import read_checkpoint
from nvfp4stack.doctor.report import DoctorReport, Finding  # noqa: F401  (re-export)
from nvfp4stack.doctor.stats import check_values
from nvfp4stack.families.family import ModelFamily
from nvfp4stack.families.registry import family_for_config


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


def _family(cfg: dict | None):
    """The registered family config.json names, or None (then only the generic checks run)."""
    if not cfg:
        return None
    try:
        return family_for_config(cfg)
    except ValueError:
        return None


def diagnose(checkpoint: str | Path, *, values: bool = True, vllm: str = "auto", plan=None) -> DoctorReport:
    """Validate ``checkpoint``; ``vllm``: 'auto' (run vLLM's load check when importable), 'on', 'off'.

    ``plan``: a planner Plan for this checkpoint; groups it would still convert are warned about.
    """
    ckpt = Path(checkpoint)
    report = DoctorReport(str(ckpt))
    if plan is not None:
        report.served = {g.name: g.served.value for g in plan.groups}
    if not ckpt.is_dir():
        report.error("files", str(ckpt), "not a directory", "a checkpoint directory", "point checkpoint= at one")
        return report
    cfg = _config(ckpt, report)
    tensors = read_checkpoint(ckpt, report)
    report.stats.update(tensors=len(tensors), bytes=sum(i.nbytes for i in tensors.values()))
    family = _family(cfg)
    loadable = family is not None and family.check_checkpoint(cfg, tensors, report)
    if values and tensors:
        check_values(tensors, report, family.gate_up_pairs if family is not None else None)
    if plan is not None:
        _check_plan(plan, report)
    why_not = _no_load_check(family, loadable, vllm, report)
    if why_not:
        report.skip("vllm_load", why_not)
    else:
        family.vllm_load_check(ckpt, report, vllm)
    return report


def _no_load_check(family, loadable: bool, mode: str, report: DoctorReport) -> str:
    """Why vLLM's load check cannot run here ('' when it can; the family may still skip it)."""
    if mode == "off":
        return "turned off (vllm='off')"
    if family is None:
        return "config.json names no registered model family, so no vLLM model to load into"
    if type(family).vllm_load_check is ModelFamily.vllm_load_check:
        return f"model family {family.name!r} has no vLLM load check"
    if not loadable:
        return "the tensor names are not the layout vLLM's loader reads (see the errors above)"
    broken = sorted(set(report.lost.values()) | {f.where for f in report.errors if f.check in ("header", "truncated")
                                                  and f.where.endswith(".safetensors")})
    if broken:
        return (f"unreadable or missing shard(s) {', '.join(broken)}: vLLM's loader stops at the first; "
                "fix the files, then run the doctor again")
    return ""


def _check_plan(plan, report: DoctorReport) -> None:
    """Groups the plan would still convert are not in their served format yet, unless `serve` casts
    them at load (the release's MXFP4 experts on our kernels: engine/moe_cast_method.py)."""
    from nvfp4stack.engine.plan_section import cast_at_load

    pending: dict[tuple, list[str]] = {}
    for g in plan.groups:
        if g.converter:
            key = (g.role, g.source.value, g.target.value, g.converter, cast_at_load(g) is not None)
            pending.setdefault(key, []).append(g.name)
    for (role, src, dst, conv, at_load), names in sorted(pending.items()):
        where = f"{names[0]} (+{len(names) - 1} more {role})"
        if at_load:
            report.note(f"plan: {where} stored {src}: serve casts them to {dst} at load ({conv} inside the "
                                "plugin, the bytes `convert` would write); no convert needed")
            continue
        report.warn("plan", where, f"stored {src}", f"{dst} (the recipe's plan)",
                    f"run 'python main.py ... convert' first (converter {conv}), or serve with a recipe whose "
                    "precision keeps this format")
