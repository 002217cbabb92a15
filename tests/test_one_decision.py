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


def _decide(recipe: str, root: Path) -> list[tuple[tuple, tuple]]:
    """(plan's outcome, serve dry run's outcome) per OVERRIDES on ``recipe``; run dirs ``root/<i>-plan|serve``."""
    import contextlib
    import io

    from nvfp4stack.tasks import plan as plan_task
    from nvfp4stack.tasks import serve as serve_task

    out = []
    with contextlib.redirect_stdout(io.StringIO()):   # the plans' tables: read from their files below
        for i, overrides in enumerate(OVERRIDES):
            p = _outcome(plan_task, compose_config(f"recipe={recipe}", *overrides, f"run_dir={root / f'{i}-plan'}"))
            s = _outcome(serve_task, compose_config(f"recipe={recipe}", *overrides, "engine.dry_run=true",
                                                    f"run_dir={root / f'{i}-serve'}"))
            out.append((p, s))
    return out


@pytest.fixture(scope="module")
def decided(request, tmp_path_factory):
    """``decided(recipe)`` -> (its run dirs' root, _decide's outcomes). Planning the full-size recipes is pure
    Python on one core (2-30 s a recipe): the recipes this session selected are decided up front, two at a time
    in worker processes on a host with two cores, the full-size ones first."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    name = test_plan_and_serve_dry_run_decide_the_same.__name__
    wanted = sorted({it.callspec.params["recipe"] for it in request.session.items
                     if getattr(it, "originalname", None) == name and it.path == request.path},
                    key=lambda r: (r.startswith("tiny"), r))
    roots = {r: tmp_path_factory.mktemp(f"decide_{r}_") for r in wanted}
    workers = min(2, len(os.sched_getaffinity(0)), len(wanted))
    if workers < 2:
        yield lambda recipe: (roots[recipe], _decide(recipe, roots[recipe]))
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {r: pool.submit(_decide, r, roots[r]) for r in wanted}
        yield lambda recipe: (roots[recipe], futures[recipe].result(timeout=1800))


@pytest.mark.parametrize("recipe", RECIPES)
def test_plan_and_serve_dry_run_decide_the_same(recipe, decided):
    root, outcomes = decided(recipe)
    n_refused = 0
    for i, (overrides, (p, s)) in enumerate(zip(OVERRIDES, outcomes, strict=True)):
        p_dir, s_dir = root / f"{i}-plan", root / f"{i}-serve"
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


EXPERTS_BF16 = "precision.rules=[{targets:[routed_experts],scheme:bf16}]"
EXPERTS_W4A16 = "precision.rules=[{targets:[routed_experts],scheme:nvfp4_w4a16}]"


def _plan_outputs(run_dir, *overrides) -> tuple[int, dict, dict]:
    """plan's exit code, backend checks and the MoE columns of its metrics.json."""
    from nvfp4stack.tasks import plan as plan_task

    code = plan_task.run(compose_config(*overrides, f"run_dir={run_dir}"))
    planned = json.loads((run_dir / "plan.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return code, planned["backend_checks"], {k: v for k, v in metrics.items() if k.startswith(("moe_", "experts_"))}


@pytest.mark.parametrize("recipe,rule,field", [
    ("tiny_dsv4", EXPERTS_W4A16, "precision.routed_experts=nvfp4_w4a16"),     # torch_emulation, served W4A16
    ("tiny_dsv4_h200", EXPERTS_BF16, "precision.routed_experts=bf16"),        # triton_w4a16 cannot run bf16
])
def test_plan_checks_the_moe_backend_against_the_experts_rules_give(recipe, rule, field, tmp_path):
    """``plan``'s MoE backend check and metrics read the planner's decision: a rule on the routed experts
    gives what the same scheme through the role's field gives, not what the field left alone says."""
    by_rule = _plan_outputs(tmp_path / "rule", f"recipe={recipe}", rule)
    by_field = _plan_outputs(tmp_path / "field", f"recipe={recipe}", field)
    unruled = _plan_outputs(tmp_path / "none", f"recipe={recipe}")
    assert by_rule == by_field
    assert by_rule[1]["moe"] != unruled[1]["moe"], f"{recipe}: the rule changes the experts' scheme, so the check"


def test_plan_refusal_is_checked_against_the_ruled_experts(tmp_path):
    """A refused explicit MoE backend is checked against the scheme the rule gives the experts, and the
    plan written beside the refusal is auto's, as for the same scheme through the role's field."""
    from nvfp4stack.kernels.select import BackendError
    from nvfp4stack.tasks import plan as plan_task

    found = []
    for i, scheme in enumerate((EXPERTS_W4A16, "precision.routed_experts=nvfp4_w4a16")):
        cfg = compose_config("recipe=tiny_dsv4", scheme, "backend.moe=flashinfer_trtllm", f"run_dir={tmp_path / str(i)}")
        with pytest.raises(BackendError, match="flashinfer_trtllm cannot run nvfp4_w4a16 on cpu"):
            plan_task.run(cfg)
        found.append(json.loads((tmp_path / str(i) / "plan.json").read_text())["backend_checks"]["moe"])
    assert found[0] == found[1]
    assert found[0]["valid"] is False and found[0]["fallback"] == "torch_emulation" and "nvfp4_w4a16" in found[0]["reason"]


def _eval_view(*overrides):
    from nvfp4stack.eval.precision import eval_precision
    from nvfp4stack.families.resolve import header_dir
    from nvfp4stack.plan.build import plan_for_config

    cfg = compose_config("recipe=tiny_dsv4", *overrides, "run_dir=/tmp/unused")
    ckpt = header_dir(cfg.model, cfg.cache_dir)   # the factory's random twin: the same headers, seconds to build
    return eval_precision(cfg, ckpt), plan_for_config(cfg)


@pytest.mark.parametrize("overrides,experts", [
    ((), "nvfp4"),
    ((EXPERTS_BF16,), "bf16"),
    ((r"precision.rules=[{targets:['re:^layers\.1\.ffn\.experts\.'],scheme:bf16}]",), "mixed"),
])
def test_eval_precision_is_the_plans_decision(overrides, experts):
    """``eval`` emulates each group in the scheme the plan stores it in, rules included."""
    prec, plan = _eval_view(*overrides)
    planned = plan.by_name()
    assert prec.targets and {n: planned[n].target for n in prec.targets} == prec.targets
    assert prec.role_schemes()["routed_experts"] == experts
    assert prec.plan_error is None and (prec.weight_bytes, prec.plan_gpu_bytes) == (plan.total_bytes, plan.gpu_bytes)
