"""``eval``: fidelity of the planned precision against the BF16 reference (or a live server's task score).

eval.level=layertest: per module / per expert output fidelity on captured real activations;
eval.level=e2e: next-token KL, top-1 agreement and perplexity over bundled texts;
eval.level=serve_task: numeric answers of a JSONL task set from an OpenAI-compatible endpoint.
Writes metrics.json and metrics.md into cfg.run_dir.
"""
from __future__ import annotations

import time


def _seed(cfg) -> int:
    # One fixed seed per sweep: every job must see the same prompts to be comparable.
    seed = int(cfg.eval.seed)
    print(f"eval: seed={seed} (prompt order and calibration texts; change with eval.seed=N)")
    return seed


def _fidelity(cfg, seed: int) -> dict:
    import torch
    from transformers import AutoTokenizer

    from nvfp4stack.eval.capture import activation_amax, capture, eval_token_ids
    from nvfp4stack.eval.e2e import end_to_end
    from nvfp4stack.eval.layertest import layertest
    from nvfp4stack.eval.precision import bf16_checkpoint_dir, eval_precision
    from nvfp4stack.models.reference import load_reference

    if cfg.model.family == "deepseek_v3" and cfg.eval.level == "e2e":
        from nvfp4stack.eval.e2e_v3 import tiny_v3_e2e

        precision, e2e = tiny_v3_e2e(cfg, lambda tok: eval_token_ids(tok, cfg.eval.num_prompts, cfg.eval.max_tokens, seed))
        return {"precision": {k: v for k, v in precision.items() if k != "checkpoint"},
                "checkpoint": precision["checkpoint"], "e2e": e2e}
    if cfg.model.family != "deepseek_v4":
        raise ValueError(f"eval.level={cfg.eval.level}: this level's reference forward is DeepSeek-V4's (model.family="
                         f"deepseek_v4), found {cfg.model.family!r}; use recipe=tiny_dsv4 or a DSV4 BF16 model.path "
                         "(the tiny DeepseekV3 default has eval.level=e2e only)")
    torch.manual_seed(seed)
    ckpt = bf16_checkpoint_dir(cfg)
    prec = eval_precision(cfg, ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = load_reference(ckpt, torch.float32)  # BF16 weights, fp32 arithmetic: the reference
    batches = eval_token_ids(tok, cfg.eval.num_prompts, cfg.eval.max_tokens, seed)
    out = {"precision": prec.role_schemes(), "weight_bytes": prec.weight_bytes, "plan_gpu_bytes": prec.plan_gpu_bytes,
           "served": prec.served, "plan_error": prec.plan_error, "checkpoint": str(ckpt)}
    if cfg.eval.level == "layertest":
        caps = capture(model, batches)
        out["layertest"] = layertest(model, caps, prec, cfg.backend.moe)
    else:
        # static W4A4 input scales calibrated on other texts than the evaluated ones
        calib = eval_token_ids(tok, cfg.eval.num_prompts, cfg.eval.max_tokens, seed + 1)
        amax = activation_amax(model, capture(model, calib, desc="calibration"))
        out["e2e"] = end_to_end(model, prec, batches, amax)
    return out


def run(cfg) -> int:
    from nvfp4stack.eval.report import write_eval

    t0 = time.perf_counter()
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
