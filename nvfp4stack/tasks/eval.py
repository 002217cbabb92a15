"""``eval``: fidelity of the planned precision against the BF16 reference (or a live server's task score).

eval.level=auto (the default): the first of the model family's levels (ModelFamily.eval_levels);
eval.level=layertest: per module / per expert output fidelity on captured real activations;
eval.level=e2e: next-token KL, top-1 agreement and perplexity over bundled texts;
eval.level=serve_task: numeric answers of a JSONL task set from an OpenAI-compatible endpoint.
Writes metrics.json and metrics.md into cfg.run_dir.
"""
from __future__ import annotations

import dataclasses
import time


def _seed(cfg) -> int:
    # One fixed seed per sweep: every job must see the same prompts to be comparable.
    seed = int(cfg.eval.seed)
    print(f"eval: seed={seed} (prompt order and calibration texts; change with eval.seed=N)")
    return seed


def _with_level(cfg):
    """``cfg`` with eval.level=auto resolved to the model family's first fidelity level."""
    if cfg.eval.level != "auto":
        return cfg
    from nvfp4stack.families.registry import get_family

    family = get_family(cfg.model.family)
    if not family.eval_levels:
        raise ValueError(f"eval.level=auto: model.family={family.name} has no reference forward to compare with; "
                         "found no eval level. Fix: set eval.level=serve_task with eval.tasks_file and eval.endpoint")
    level = family.eval_levels[0]
    print(f"eval: eval.level=auto -> {level} (model.family={family.name}; others: "
          f"{', '.join(family.eval_levels[1:]) or 'none'}, serve_task)")
    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, level=level))


def _fidelity(cfg, seed: int) -> dict:
    """The model family's fidelity harness for ``eval.level`` (its reference forward)."""
    from nvfp4stack.families.registry import get_family

    family = get_family(cfg.model.family)
    if cfg.eval.level not in family.eval_levels:
        raise ValueError(f"eval.level={cfg.eval.level}: model.family={family.name} has a reference forward for "
                         f"{', '.join(family.eval_levels) or 'no level'}; found {cfg.eval.level!r}. Fix: pick one "
                         "of those, or a recipe whose model family has this level")
    return family.fidelity(cfg, seed)


def run(cfg) -> int:
    from nvfp4stack.eval.report import write_eval

    t0 = time.perf_counter()
    cfg = _with_level(cfg)
    seed = _seed(cfg)
    metrics = {"level": cfg.eval.level, "model": cfg.model.name, "recipe": cfg.recipe, "seed": seed,
               "num_prompts": cfg.eval.num_prompts, "max_tokens": cfg.eval.max_tokens}
    if cfg.eval.level == "serve_task":
        from nvfp4stack.eval.serve_task import run_tasks

        metrics["serve_task"] = run_tasks(cfg.eval.tasks_file, cfg.eval.endpoint,
                                          model=getattr(cfg.model, "served_name", None) or cfg.model.name,
                                          max_tokens=cfg.eval.max_tokens,
                                          rel_tol=float(getattr(cfg.eval, "rel_tol", 1e-6)))
    else:
        metrics.update(_fidelity(cfg, seed))
    metrics["seconds"] = round(time.perf_counter() - t0, 2)
    j, m = write_eval(cfg.run_dir, metrics)
    print(m.read_text())
    print(f"eval: wrote {j} and {m} in {metrics['seconds']} s")
    if metrics.get("plan_error"):
        # The emulated fidelity is still written, but this precision cannot be served as configured:
        # the CLI turns PlanError into its one-line exit 2, like `plan` and `serve` for the same keys.
        from nvfp4stack.plan.planner import PlanError

        raise PlanError(f"the recipe's plan failed ({metrics['plan_error']}); the metrics in {j} are emulation "
                        f"only. Fix the precision/backend keys it names (check with 'python main.py "
                        f"recipe={cfg.recipe} plan')")
    return 0
