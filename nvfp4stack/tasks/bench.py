"""``bench``: run one benchmark (``bench=formats|moe_kernel|cold_start``) and save its rows."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

from nvfp4stack.io_atomic import atomic_write_text


def run(cfg) -> int:
    module = importlib.import_module(f"nvfp4stack.bench.{cfg.bench.name}")
    rows = module.run(cfg)
    if isinstance(rows, int):  # a benchmark that prints and saves its own table returns its exit code
        return rows
    out = Path(cfg.run_dir) / "metrics.json"
    atomic_write_text(out, json.dumps({"bench": cfg.bench.name, "rows": rows}, indent=2, default=str))
    print(f"benchmark rows written to {out}")
    return 0
