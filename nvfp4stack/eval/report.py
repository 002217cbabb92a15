"""metrics.json and the short markdown table of one eval run."""
from __future__ import annotations

import json
from pathlib import Path

from nvfp4stack.io_atomic import atomic_write_text


def summary_of(metrics: dict) -> dict[str, float]:
    """Flat scalars a sweep compares: ``fidelity`` (higher is better) first, then per-role figures."""
    s: dict[str, float] = {}
    lt, e2e, task = metrics.get("layertest"), metrics.get("e2e"), metrics.get("serve_task")
    if e2e:
        s["fidelity"] = e2e["top1_agreement"]
        s.update({k: e2e[k] for k in ("kl_mean", "top1_agreement", "ppl_ref", "ppl_quant")})
    if lt:
        roles = lt["roles"]
        s.setdefault("fidelity", min(r["cosine_min"] for r in roles.values()))
        for role, r in roles.items():
            s[f"cos_min.{role}"] = r["cosine_min"]
            s[f"sqnr_db_min.{role}"] = r["sqnr_db_min"]
    if task:
        s.setdefault("fidelity", task["accuracy"])
        s["accuracy"] = task["accuracy"]
    return s


def markdown(metrics: dict) -> str:
    """A short human table: the roles (layertest), the e2e line, the task score."""
    lines = [f"# eval ({metrics['level']}) of {metrics['model']}, recipe {metrics['recipe']}", ""]
    if metrics.get("weight_bytes") is not None:
        lines.append(f"weight bytes: {metrics['weight_bytes']:,}; fidelity: {metrics['summary'].get('fidelity', float('nan')):.6f}")
        lines.append("")
    lt = metrics.get("layertest")
    if lt:
        lines += ["| role | scheme | modules | cosine min | cosine mean | SQNR min (dB) | max rel err |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for role, r in lt["roles"].items():
            lines.append(f"| {role} | {r['scheme']} | {r['modules']} | {r['cosine_min']:.6f} | {r['cosine_mean']:.6f} "
                         f"| {r['sqnr_db_min']:.2f} | {r['max_rel_err_max']:.4g} |")
        lines.append("")
        for layer, e in lt["experts"].items():
            m = e["layer"]
            lines.append(f"MoE layer {layer} ({e['scheme']}, {e['kernel']}): cosine {m['cosine']:.6f}, "
                         f"SQNR {m['sqnr_db']:.2f} dB, max rel err {m['max_rel_err']:.4g}")
        lines.append("")
    e2e = metrics.get("e2e")
    if e2e:
        lines += ["| positions | KL mean | KL max | top-1 agreement | ppl bf16 | ppl quant |", "|---:|---:|---:|---:|---:|---:|",
                  f"| {e2e['positions']} | {e2e['kl_mean']:.3e} | {e2e['kl_max']:.3e} | {e2e['top1_agreement']:.4f} "
                  f"| {e2e['ppl_ref']:.3f} | {e2e['ppl_quant']:.3f} |", ""]
    task = metrics.get("serve_task")
    if task:
        lines += [f"serve_task: {task['correct']}/{task['total']} correct (accuracy {task['accuracy']:.4f}) "
                  f"against {task['endpoint']} model {task['model']}", ""]
    if metrics.get("plan_error"):
        lines.append(f"note: the full plan did not build here ({metrics['plan_error']}); schemes above are the plan's targets")
    return "\n".join(lines) + "\n"


def write_eval(run_dir: str | Path, metrics: dict) -> tuple[Path, Path]:
    """Write metrics.json and metrics.md (atomically) into the run dir."""
    metrics["summary"] = summary_of(metrics)
    run_dir = Path(run_dir)
    j = atomic_write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2, default=str))
    m = atomic_write_text(run_dir / "metrics.md", markdown(metrics))
    return j, m
