"""Hydra callback: write the sweep report when a multirun of ``eval``, ``bench`` or ``plan`` ends.

Enable in conf/config.yaml:  hydra: {callbacks: {sweep_report: {_target_: nvfp4stack.eval.sweep_callback.SweepReportCallback}}}
"""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback


class SweepReportCallback(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        from nvfp4stack.eval.sweep_report import write_sweep_report

        if config.get("command") not in ("eval", "bench", "plan"):
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            paths = write_sweep_report(sweep_dir)
        except FileNotFoundError as e:  # every job failed: the CLI reports the failures itself
            print(f"sweep report skipped: {e}", file=sys.stderr)
            return
        print("sweep report: " + ", ".join(str(p) for p in paths.values()))
