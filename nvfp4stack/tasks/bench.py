"""``bench``: run one benchmark (``bench=formats|moe_kernel|cold_start``) and save its rows."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

from nvfp4stack.io_atomic import atomic_write_text


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return "x".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def format_rows(rows: list[dict]) -> str:
    """A benchmark's rows as an aligned text table (columns in first-seen order)."""
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_cell(r.get(c, "")) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, width)).rstrip()  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in width]), *(line(r) for r in cells)])


def run(cfg) -> int:
    module = importlib.import_module(f"nvfp4stack.bench.{cfg.bench.name}")
    rows = module.run(cfg)
    if isinstance(rows, int):  # a benchmark that prints and saves its own table returns its exit code
        return rows
    print(format_rows(rows))
    out = Path(cfg.run_dir) / "metrics.json"
    atomic_write_text(out, json.dumps({"bench": cfg.bench.name, "rows": rows}, indent=2, default=str))
    print(f"benchmark rows written to {out}")
    return 0
