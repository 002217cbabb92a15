"""What `plan` decides is what `serve` runs (issue #18).

Every recipe, with each of a list of precision / backend overrides, goes through both the ``plan``
task and ``serve engine.dry_run=true``: both accept with the same per-module engine decisions
(plan.json's ``engine`` section equals the engine_plan.json that serve writes and passes to vLLM),
or both refuse with the same error.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvfp4stack.cli import compose_config

RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
OVERRIDES = [
    (),
    ("precision.attn.wo_a=nvfp4",),                                           # hard rule on DSV4
    ("precision.rules=[{targets:[routed_experts],scheme:bf16}]",),            # role target
    (r"precision.rules=[{targets:['re:layers\.1\.(ffn|mlp)\.experts\.'],scheme:bf16}]",),  # regex: one layer
    ("precision.rules=[{targets:['layers.*.ffn.shared_experts.*'],scheme:bf16}]",),       # glob
    ("precision.rules=[{targets:[attn],ignore:[attn.wo_a],scheme:fp8_block}]",),           # subtree + ignore
    ("backend.moe=flashinfer_trtllm",),                                       # refused off sm100a/sm103a
    (r"precision.rules=[{targets:['re:experts\.3\.'],scheme:bf16}]",),        # splits a MoE layer
]


def _outcome(task, cfg):
    try:
        code = task.run(cfg)
    except Exception as e:  # the tasks raise errors written for people; the CLI maps them to exit 2
        return ("refused", type(e).__name__, str(e))
    return ("ok", code)


@pytest.mark.parametrize("recipe", RECIPES)
def test_plan_and_serve_dry_run_decide_the_same(recipe, tmp_path):
    from nvfp4stack.tasks import plan as plan_task
    from nvfp4stack.tasks import serve as serve_task

    n_refused = 0
    for i, overrides in enumerate(OVERRIDES):
        p_dir, s_dir = tmp_path / f"{i}-plan", tmp_path / f"{i}-serve"
        p = _outcome(plan_task, compose_config(f"recipe={recipe}", *overrides, f"run_dir={p_dir}"))
        s = _outcome(serve_task, compose_config(f"recipe={recipe}", *overrides, "engine.dry_run=true",
                                                f"run_dir={s_dir}"))
        where = f"recipe={recipe} {' '.join(overrides)}"
        if p[0] == "refused" or s[0] == "refused":
            assert p == s, f"{where}: plan {p} vs serve {s}"
            n_refused += 1
            continue
        # plan exits 1 where nothing fits in memory (BF16 experts of V4 Pro), and serve refuses it with
        # the same code (dry run included: engine.allow_overcommit=true serves anyway)
        assert s == p and p in (("ok", 0), ("ok", 1)), f"{where}: plan {p}, serve {s}"
        if p == ("ok", 1):
            continue
        planned = json.loads((p_dir / "plan.json").read_text())["engine"]
        served = json.loads((s_dir / "engine_plan.json").read_text())
        assert planned == served, f"{where}: plan and serve decide differently"
        argv = (s_dir / "serve_command.sh").read_text()
        experts = served["roles"].get("routed_experts")
        if experts and experts["scheme"] == "bf16" and "layers" not in served:
            assert "--moe-backend" not in argv, f"{where}: BF16 experts must not get an NVFP4 MoE backend"
    assert n_refused >= 1  # the split-layer rule is refused everywhere


def test_per_layer_rule_reaches_the_engine_section(tmp_path):
    """A rule keeping layer 1's routed experts BF16 on the H200 recipe: the role default stays
    NVFP4 on triton_w4a16 and layer 1 is an exception, inside the --hf-overrides plan section."""
    from nvfp4stack.engine.plan_section import engine_plan_for

    cfg = compose_config("recipe=dsv4_h200", r"precision.rules=[{targets:['re:^layers\.1\.ffn\.experts\.'],scheme:bf16}]",
                         f"run_dir={tmp_path}")
    plan = engine_plan_for(cfg)
    assert plan.roles["routed_experts"] == {"scheme": "nvfp4_w4a16", "kernel": "triton_w4a16", "cast": "mxfp4_to_nvfp4"}
    assert plan.layers["routed_experts"] == {"1": {"scheme": "bf16", "kernel": "unquantized"}}
    assert plan.own_kernel("model.layers.1.ffn.experts", "moe") is None
    assert plan.own_kernel("model.layers.2.ffn.experts", "moe") == "triton_w4a16"
