"""How busy the GPUs were while a benchmark round ran: NVML's utilization (the share of time in which a
kernel was executing, averaged by the driver over its own window), sampled in a thread.

Why (issue #35): on the 8-layer synthetic model, the cells whose decode step took 1.6-3.5 ms (every MoE
setting at batch 1, bf16 included; the NVFP4 ones at 8-32) spread 4-38% between rounds on an H200, while bf16
at batch 8-128, where the step is the GPU's (3.7-7.0 ms), spread 0.4-1.7%. A cell in which the GPU sits
idle most of the step measures vLLM's host side, not the kernels, and no number of rounds turns it into a
kernel comparison. Printing the GPU's busy share next to each cell says which cells can compare kernels at all.

The figure is the mean of the driver's own utilization samples stamped inside the round
(``nvmlDeviceGetSamples``; an H200's driver stamps one every 200 ms); where the driver gives none, the mean
of ``nvmlDeviceGetUtilizationRates`` polled every 50 ms, which lags by the driver's averaging window. On an
H200 (2026-11-28, ``bench/tools/gpu_busy_check.py``: bf16 8192x8192 matmuls in a loop for 3 s; 512x512
matmuls with a 2 ms host sleep between bursts for 3 s; 2 s idle): 90.7% / 4.3% / 0.1% from the driver's
samples, 87.6% / 7.5% / 0.0% polled (a second run: 91.8 / 3.1 / 0.0%).

NVML comes from ``pynvml`` (nvidia-ml-py) or the copy vLLM ships (``vllm.third_party.pynvml``); where
neither loads, or no GPU answers (a CPU host), ``busy()`` yields a sampler whose ``percent`` is None.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable, Iterator

PERIOD_S = 0.05


def _nvml():
    for name in ("pynvml", "vllm.third_party.pynvml"):
        with contextlib.suppress(ImportError):
            return __import__(name, fromlist=["nvmlInit"])
    return None


class NvmlReader:
    """NVML's utilization.gpu of ``devices``: ``now()`` reads the driver's current figure (averaged over its
    own window of 1/6 s to 1 s, so it lags a change by up to that), ``since(t0_us)`` averages the driver's
    raw samples stamped at or after ``t0_us`` (microseconds of the host clock; None where the driver keeps
    none or refuses ``nvmlDeviceGetSamples``)."""

    def __init__(self, nv, handles: list):
        self.nv, self.handles = nv, handles

    def now(self) -> float:
        return statistics.fmean(self.nv.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles)

    def since(self, t0_us: int) -> float | None:
        per_device = []
        for h in self.handles:
            try:
                _, samples = self.nv.nvmlDeviceGetSamples(h, self.nv.NVML_GPU_UTILIZATION_SAMPLES, t0_us)
            except Exception:  # noqa: BLE001 - NVMLError_NotSupported / NotFound: the polled figure stands
                return None
            values = [x.sampleValue.uiVal for x in samples if x.timeStamp >= t0_us]
            if not values:
                return None
            per_device.append(statistics.fmean(values))
        return statistics.fmean(per_device)

    def close(self) -> None:
        self.nv.nvmlShutdown()


def nvml_reader(devices: list[int]) -> NvmlReader | None:
    """A reader of ``devices``; None where NVML or the devices cannot be reached."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError and its subclasses (no driver, no GPU): no figure, said as None
        return None
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in devices]
    except Exception:  # noqa: BLE001 - a device index the host does not have
        nv.nvmlShutdown()
        return None
    return NvmlReader(nv, handles)


class Sampler:
    """Samples ``read`` every ``period`` seconds in a daemon thread until stopped."""

    def __init__(self, read: Callable[[], float] | None, period: float = PERIOD_S):
        self.read, self.period = read, period
        self.samples: list[float] = []
        self.window: float | None = None   # the driver's own samples inside the block (busy() sets it)
        self.error: str | None = None      # why polling stopped early, if it did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-busy") if read else None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.read())
            except Exception as exc:  # noqa: BLE001 - NVMLError (NotSupported under MIG, GPU lost): stop polling, keep the rest
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self._stop.wait(self.period)

    def start(self) -> "Sampler":
        if self._thread:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    @property
    def percent(self) -> float | None:
        """The driver's samples inside the block where it gave them (``window``), else the mean of the polled
        figures (%), or None: no NVML, or the block was over before the first sample."""
        if self.window is not None:
            return self.window
        return statistics.fmean(self.samples) if self.samples else None


@contextlib.contextmanager
def busy(devices: list[int], period: float = PERIOD_S) -> Iterator[Sampler]:
    """``with busy([0]) as s: ...`` then ``s.percent``: the GPUs' mean busy share while the block ran. NVML is
    shut down however the block or the sampling ends."""
    reader = nvml_reader(devices)
    try:
        t0_us = int(time.time() * 1e6)
        sampler = Sampler(reader.now if reader else None, period).start()
        try:
            yield sampler
        finally:
            sampler.stop()
            if reader:
                sampler.window = reader.since(t0_us)
    finally:
        if reader:
            reader.close()
