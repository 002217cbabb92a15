"""Sweep report: one row per job of a Hydra multirun (its overrides + its metrics.json), written as
a markdown table, a CSV, and a PNG of fidelity against weight bytes with the Pareto front marked.

``python -m nvfp4stack.eval.sweep_report <sweep_dir> [--metric fidelity]``; the Hydra callback in
sweep_callback.py calls the same ``write_sweep_report`` at the end of every multirun. Bench sweeps
work the same way: each metrics.json row becomes a report row (no plot without weight bytes).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import tempfile
from pathlib import Path

from nvfp4stack.io_atomic import atomic_write_text

_SKIP_OVERRIDES = ("command=", "recipes@_global_=", "hydra.", "+hydra.", "run_dir=")


def job_overrides(job_dir: Path) -> dict[str, str]:
    """key -> value of the overrides Hydra recorded for one job (.hydra/overrides.yaml)."""
    f = job_dir / ".hydra" / "overrides.yaml"
    if not f.exists():
        return {}
    from omegaconf import OmegaConf

    out = {}
    for ov in OmegaConf.to_container(OmegaConf.load(f)):
        if "=" in ov and not ov.startswith(_SKIP_OVERRIDES):
            k, v = ov.split("=", 1)
            out[k.lstrip("+~")] = v
    return out


def _scalars(d: dict, prefix: str = "") -> dict[str, float | str]:
    """Numeric (and short string) leaves of a flat-ish dict."""
    out: dict[str, float | str] = {}
    for k, v in d.items():
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)):
            out[prefix + k] = v
        elif isinstance(v, str) and len(v) <= 40:
            out[prefix + k] = v
    return out


def collect(sweep_dir: str | Path) -> list[dict]:
    """Rows of the report: job, its overrides, then what its metrics.json holds."""
    rows = []
    jobs = sorted((p.parent for p in Path(sweep_dir).glob("*/metrics.json")),
                  key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))
    for job in jobs:
        m = json.loads((job / "metrics.json").read_text())
        base = {"job": job.name, **job_overrides(job)}
        if "summary" in m:  # eval
            rows.append({**base, "weight_bytes": m.get("weight_bytes"), **m["summary"]})
        elif isinstance(m.get("rows"), list):  # bench: one report row per measured row
            rows += [{**base, **_scalars(r)} for r in m["rows"] if isinstance(r, dict)]
        else:
            rows.append({**base, **_scalars(m)})
    return rows


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats: fewer (or equal) bytes and higher (or equal) fidelity."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _columns(rows: list[dict], varied: list[str]) -> list[str]:
    cols = ["job", *varied]
    for r in rows:
        cols += [k for k in r if k not in cols]
    return cols


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else str(v)


def varied_keys(rows: list[dict]) -> list[str]:
    """Override keys whose value differs between jobs (what the sweep swept)."""
    keys = [k for r in rows for k in r if "." in k or k in ("recipe",)]
    seen = list(dict.fromkeys(keys))
    return [k for k in seen if len({str(r.get(k)) for r in rows}) > 1 and not k.startswith(("cos_min.", "sqnr_db_min."))]


def write_sweep_report(sweep_dir: str | Path, metric: str = "fidelity") -> dict[str, Path]:
    """Write sweep_report.{md,csv,png} into ``sweep_dir``; returns the paths written."""
    sweep_dir = Path(sweep_dir)
    rows = collect(sweep_dir)
    if not rows:
        raise FileNotFoundError(f"{sweep_dir}: no */metrics.json from any job; did the sweep's jobs run "
                                "eval or bench? (each job writes metrics.json into its own subdir)")
    varied = varied_keys(rows)
    cols = _columns(rows, varied)
    pts = [(float(r["weight_bytes"]), float(r[metric])) for r in rows
           if isinstance(r.get("weight_bytes"), (int, float)) and isinstance(r.get(metric), (int, float))]
    front = set(pareto_front(pts)) if len(pts) == len(rows) else set()
    for i, r in enumerate(rows):
        r["pareto"] = "yes" if i in front else ""
    cols.append("pareto")
    paths = {}
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    paths["csv"] = atomic_write_text(sweep_dir / "sweep_report.csv", buf.getvalue())
    order = sorted(range(len(rows)), key=lambda i: -float(rows[i].get(metric) or 0)) if pts else range(len(rows))
    # the markdown keeps what differs between rows (the CSV keeps every column)
    keep = ["job", *varied, "weight_bytes", metric, "pareto"]
    shown = [c for c in cols if c in keep or len({_fmt(r.get(c)) for r in rows}) > 1]
    fixed = {c: _fmt(rows[0].get(c)) for c in cols if c not in shown}
    md = [f"# sweep report: {sweep_dir}", "", f"{len(rows)} rows; sorted by {metric} (higher is better)"
          if pts else f"{len(rows)} rows", "",
          "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    md += ["| " + " | ".join(_fmt(rows[i].get(c)) for c in shown) + " |" for i in order]
    if fixed:
        md += ["", "same in every row: " + ", ".join(f"{k}={v}" for k, v in fixed.items())]
    paths["md"] = atomic_write_text(sweep_dir / "sweep_report.md", "\n".join(md) + "\n")
    if pts and len(pts) == len(rows):
        paths["png"] = _plot(sweep_dir / "sweep_report.png", rows, pts, sorted(front, key=lambda i: pts[i][0]), varied, metric)
    return paths


def _plot(path: Path, rows, pts, front, varied, metric) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, key) = plt.subplots(1, 2, figsize=(11, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    xs, ys = [p[0] / 2**20 for p in pts], [p[1] for p in pts]
    ax.scatter(xs, ys, color="tab:blue", label="job")
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "-o", color="tab:red", mfc="none", ms=12, label="Pareto front")
    legend_lines = []
    for i, r in enumerate(rows):
        # short job labels at the points (neighbours often overlap); the key on the right spells them out
        ax.annotate(f"#{r['job']}", (xs[i], ys[i]), fontsize=8, xytext=(5, 4 + 9 * (i % 3)), textcoords="offset points")
        legend_lines.append(f"#{r['job']}{' *' if i in front else ''}: "
                            + (", ".join(f"{k.split('.', 1)[-1]}={r.get(k)}" for k in varied) or "-"))
    key.axis("off")
    key.text(0, 1, "\n".join(["* = on the Pareto front", *legend_lines]), va="top", family="monospace", fontsize=8)
    ax.set_xlabel("weight bytes (MiB)")
    ax.set_ylabel(metric)
    ax.set_title("fidelity vs weight bytes")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nvfp4stack.eval.sweep_report", description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--metric", default="fidelity", help="column plotted against weight bytes (higher is better)")
    a = ap.parse_args(argv)
    try:
        paths = write_sweep_report(a.sweep_dir, a.metric)
    except FileNotFoundError as e:
        print(f"sweep_report: {e}", file=sys.stderr)
        return 2
    print((Path(paths["md"])).read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
