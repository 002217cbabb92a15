"""Check of bench=engine's GPU busy share (nvfp4stack/bench/gpu_busy.py) on a GPU host: three known loads,
each measured by ``busy()`` as a benchmark round is.

  PYTHONPATH=$PWD python3 bench/tools/gpu_busy_check.py

- idle: 2 s of nothing (expect about 0%);
- saturated: 8192x8192 bf16 matmuls back to back for 3 s (expect near 100%; the first driver sample of the
  block covers some time before it);
- host-bound: five 512x512 matmuls, a synchronize and a 2 ms host sleep, for 3 s (expect a few %).

Prints, per load, the figure ``busy()`` reports, the driver's own samples inside the block, and the polled
figure. H200, 2026-11-28, two runs: 0.1 / 90.7 / 4.3% and 0.0 / 91.8 / 3.1% (polled 0.0 / 87.6 / 7.5% and
0.3 / 86.8 / 7.6%).
"""
from __future__ import annotations

import statistics
import time

import torch

from nvfp4stack.bench.gpu_busy import _nvml, busy


def _for(seconds: float, step) -> None:
    t0 = time.time()
    while time.time() - t0 < seconds:
        step()


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_busy_check: no CUDA device here; run it on a GPU host")
        return 1
    print("NVML module:", _nvml())
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)

    def saturate() -> None:
        for _ in range(20):
            big @ big
        torch.cuda.synchronize()

    def host_bound() -> None:
        for _ in range(5):
            small @ small
        torch.cuda.synchronize()
        time.sleep(0.002)

    torch.cuda.synchronize()
    with busy([0]) as idle:
        time.sleep(2.0)
    with busy([0]) as full:
        _for(3.0, saturate)
    with busy([0]) as host:
        _for(3.0, host_bound)
    for name, s in (("idle", idle), ("saturated", full), ("host-bound", host)):
        polled = statistics.fmean(s.samples) if s.samples else None
        print(f"{name:11s} busy {s.percent}  (driver samples {s.window}, polled {polled} over {len(s.samples)} polls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
