"""``python main.py recipe=... doctor checkpoint=PATH``: validate a checkpoint before serving it.

Prints one table (errors, then warnings), writes ``<run_dir>/doctor.json``, exits 1 on errors.
Without ``checkpoint=`` the recipe's own model directory is checked.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path


def _target(cfg) -> Path:
    if cfg.checkpoint:
        return Path(cfg.checkpoint).expanduser()
    from nvfp4stack.families.resolve import model_dir

    d = model_dir(cfg.model, cfg.cache_dir)
    if d is None:
        raise FileNotFoundError(f"model {cfg.model.name} is a weight-free descriptor: give checkpoint=<dir> "
                                "to the doctor")
    return d


def _plan(cfg, ckpt: Path, report) -> object | None:
    """The recipe's plan for this checkpoint, or None (the reason becomes a warning)."""
    from nvfp4stack.plan.build import plan_for_config

    try:
        model = dataclasses.replace(cfg.model, path=str(ckpt), factory=None, descriptor=None)
        return plan_for_config(dataclasses.replace(cfg, model=model))
    except Exception as e:  # the plan is one input among several: report it, keep checking
        report.warn("plan", f"recipe {cfg.recipe}", f"no plan ({type(e).__name__}: {e})",
                    "a plan for this checkpoint", "check the recipe with 'python main.py recipe=... plan'")
        return None


def run(cfg) -> int:
    from nvfp4stack.doctor import diagnose
    from nvfp4stack.doctor.plan import check_plan_agreement
    from nvfp4stack.doctor.report import DoctorReport
    from nvfp4stack.io_atomic import atomic_write_text

    ckpt = _target(cfg)
    pre = DoctorReport(str(ckpt))
    plan = _plan(cfg, ckpt, pre) if ckpt.is_dir() else None
    report = diagnose(ckpt, plan=plan)
    report.findings[:0] = pre.findings
    if plan is not None:
        # the checkpoint's quantization_config against its tensors and against the plan serve runs
        check_plan_agreement(plan, ckpt, report)
    out = Path(cfg.run_dir) / "doctor.json"
    atomic_write_text(out, json.dumps(report.to_json(), indent=2))
    print(report.table(full_list=str(out)))
    return report.exit_code
