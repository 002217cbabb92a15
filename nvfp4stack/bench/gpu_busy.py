"""How busy the GPUs were while a benchmark round ran: NVML's utilization (the share of time in which a
kernel was executing, averaged by the driver over its own window), sampled in a thread.

Why (issue #35): on the 8-layer synthetic model, a decode step at batch 1-32 takes 1.6-3.5 ms for every
MoE setting, bf16 included, and its rounds spread 10-40%; bf16 at batch 32-128, where the step is the GPU's
(5.8-7.0 ms), spread 0.4%. A cell in which the GPU sits idle most of the step measures vLLM's host side, not
the kernels, and no number of rounds turns it into a kernel comparison. Printing the GPU's busy share next
to each cell says which cells can compare kernels at all.

NVML comes from ``pynvml`` (nvidia-ml-py) or the copy vLLM ships (``vllm.third_party.pynvml``); where
neither loads, or no GPU answers (a CPU host), ``busy()`` yields a sampler whose ``percent`` is None.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Callable, Iterator

PERIOD_S = 0.05


def _nvml():
    for name in ("pynvml", "vllm.third_party.pynvml"):
        with contextlib.suppress(ImportError):
            return __import__(name, fromlist=["nvmlInit"])
    return None


def nvml_reader(devices: list[int]) -> tuple[Callable[[], float], Callable[[], None]] | None:
    """(read, close): ``read()`` gives the mean utilization.gpu (%) of ``devices`` now; None where NVML or
    the devices cannot be reached."""
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
    return (lambda: statistics.fmean(nv.nvmlDeviceGetUtilizationRates(h).gpu for h in handles)), nv.nvmlShutdown


class Sampler:
    """Samples ``read`` every ``period`` seconds in a daemon thread until stopped."""

    def __init__(self, read: Callable[[], float] | None, period: float = PERIOD_S):
        self.read, self.period = read, period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-busy") if read else None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read())
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
        """The mean of the samples (%), or None: no NVML, or the round was over before the first sample."""
        return statistics.fmean(self.samples) if self.samples else None


@contextlib.contextmanager
def busy(devices: list[int], period: float = PERIOD_S) -> Iterator[Sampler]:
    """``with busy([0]) as s: ...`` then ``s.percent``: the GPUs' mean busy share while the block ran."""
    reader = nvml_reader(devices)
    sampler = Sampler(reader[0] if reader else None, period).start()
    try:
        yield sampler
    finally:
        sampler.stop()
        if reader:
            reader[1]()
