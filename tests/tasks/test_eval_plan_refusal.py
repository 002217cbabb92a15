"""``eval`` refuses like ``plan`` (issue #18): a backend the planner refuses on this arch still gets
its emulated metrics written, then the task raises the planner's refusal (the CLI's exit 2)."""
from __future__ import annotations

import json

import pytest

from nvfp4stack.cli import compose_config
from nvfp4stack.plan.planner import PlanError


def test_refused_backend_writes_emulated_metrics_then_raises(tmp_path):
    from nvfp4stack.tasks import eval as eval_task
    from nvfp4stack.tasks import plan as plan_task

    overrides = ("recipe=tiny_dsv4", "backend.moe=flashinfer_trtllm")   # sm100a-only kernel, arch cpu
    with pytest.raises(Exception) as planned:
        plan_task.run(compose_config(*overrides, f"run_dir={tmp_path / 'plan'}"))
    cfg = compose_config(*overrides, "eval.level=e2e", "eval.num_prompts=1", "eval.max_tokens=8",
                         "eval.seed=7", f"run_dir={tmp_path / 'eval'}", "command=eval")
    with pytest.raises(PlanError) as refused:
        eval_task.run(cfg)
    msg = str(refused.value)
    assert "\n" not in msg and str(planned.value) in msg       # the planner's own words, one line
    assert "metrics.json" in msg and "recipe=tiny_dsv4 plan" in msg
    m = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert m["plan_error"].endswith(str(planned.value)) and m["e2e"]["positions"] == 7
