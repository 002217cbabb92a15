"""The GPU busy share of a benchmark round (nvfp4stack/bench/gpu_busy.py), on stand-ins for NVML."""
from __future__ import annotations

import itertools
import time
import types

import pytest


def test_the_sampler_averages_what_it_read_until_stopped():
    from nvfp4stack.bench.gpu_busy import Sampler

    values = itertools.cycle([20.0, 60.0])   # a host-bound step: the GPU idle most of the time
    s = Sampler(lambda: next(values), period=0.001).start()
    deadline = time.monotonic() + 5
    while len(s.samples) < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    s.stop()
    n = len(s.samples)
    assert n >= 4 and s.samples[:4] == [20.0, 60.0, 20.0, 60.0]
    assert s.percent == pytest.approx(sum(s.samples) / n)
    time.sleep(0.01)
    assert len(s.samples) == n   # stopped means stopped


def test_no_reader_no_figure():
    from nvfp4stack.bench.gpu_busy import Sampler

    s = Sampler(None).start()
    s.stop()
    assert s.percent is None and s.samples == []


def _fake_nvml(util: dict[int, int], fail_init: bool = False):
    calls = []

    class NVMLError(Exception):
        pass

    def init():
        calls.append("init")
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def handle(i):
        if i not in util:
            raise NVMLError(f"Invalid Argument: no device {i}")
        return i

    nv = types.SimpleNamespace(
        nvmlInit=init, nvmlShutdown=lambda: calls.append("shutdown"), nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=util[h], memory=0))
    return nv, calls


def test_the_reader_averages_the_servers_gpus_and_shuts_nvml_down(monkeypatch):
    import nvfp4stack.bench.gpu_busy as gb

    nv, calls = _fake_nvml({0: 90, 1: 30, 2: 0})
    monkeypatch.setattr(gb, "_nvml", lambda: nv)
    with gb.busy([0, 1], period=0.001) as s:
        deadline = time.monotonic() + 5
        while not s.samples and time.monotonic() < deadline:
            time.sleep(0.005)
    assert s.percent == 60.0 and set(s.samples) == {60.0}   # GPUs 0 and 1 only, not the idle third
    assert calls == ["init", "shutdown"]


@pytest.mark.parametrize("case", ["no module", "no driver", "no such device"])
def test_a_host_without_nvml_or_that_gpu_gives_no_figure(monkeypatch, case):
    import nvfp4stack.bench.gpu_busy as gb

    nv, calls = _fake_nvml({0: 50}, fail_init=case == "no driver")
    monkeypatch.setattr(gb, "_nvml", lambda: None if case == "no module" else nv)
    with gb.busy([3] if case == "no such device" else [0]) as s:
        pass
    assert s.percent is None
    assert calls == {"no module": [], "no driver": ["init"], "no such device": ["init", "shutdown"]}[case]


def test_the_drivers_own_samples_inside_the_block_win_over_the_polled_figure(monkeypatch):
    """nvmlDeviceGetSamples: only samples stamped at or after the block's start count (the one before is the
    idle time the polled figure lags with), averaged per GPU, then over GPUs."""
    import nvfp4stack.bench.gpu_busy as gb

    nv, calls = _fake_nvml({0: 10, 1: 10})   # the polled figure: 10%
    asked = []

    def samples(h, kind, since_us):
        asked.append((h, kind, since_us))
        t0 = since_us
        stamped = {0: [(t0 - 200_000, 0), (t0 + 1, 100), (t0 + 200_000, 80)], 1: [(t0 + 5, 40), (t0 + 9, 60)]}[h]
        return 1, [types.SimpleNamespace(timeStamp=t, sampleValue=types.SimpleNamespace(uiVal=v)) for t, v in stamped]

    nv.NVML_GPU_UTILIZATION_SAMPLES = 1
    nv.nvmlDeviceGetSamples = samples
    monkeypatch.setattr(gb, "_nvml", lambda: nv)
    before = int(time.time() * 1e6)
    with gb.busy([0, 1], period=0.001) as s:
        body_start = int(time.time() * 1e6)
        time.sleep(0.01)
    assert s.window == 70.0 and s.percent == 70.0    # (90 + 50) / 2; the sample before the start left out
    assert s.samples and set(s.samples) == {10.0}
    assert [a[:2] for a in asked] == [(0, 1), (1, 1)]
    assert all(before <= a[2] <= body_start for a in asked)   # the window opens as the block starts
    assert calls == ["init", "shutdown"]


def test_a_driver_without_samples_leaves_the_polled_figure(monkeypatch):
    import nvfp4stack.bench.gpu_busy as gb

    nv, _ = _fake_nvml({0: 30})
    nv.NVML_GPU_UTILIZATION_SAMPLES = 1
    nv.nvmlDeviceGetSamples = lambda h, kind, since: (1, [])   # nothing stamped since the start
    monkeypatch.setattr(gb, "_nvml", lambda: nv)
    with gb.busy([0], period=0.001) as s:
        deadline = time.monotonic() + 5
        while not s.samples and time.monotonic() < deadline:
            time.sleep(0.005)
    assert s.window is None and s.percent == 30.0


def test_a_driver_that_refuses_samples_leaves_the_polled_figure(monkeypatch):
    import nvfp4stack.bench.gpu_busy as gb

    nv, calls = _fake_nvml({0: 20})
    nv.NVML_GPU_UTILIZATION_SAMPLES = 1

    def refuse(h, kind, since):
        raise RuntimeError("NVMLError_NotSupported")

    nv.nvmlDeviceGetSamples = refuse
    monkeypatch.setattr(gb, "_nvml", lambda: nv)
    with gb.busy([0], period=0.001) as s:
        deadline = time.monotonic() + 5
        while not s.samples and time.monotonic() < deadline:
            time.sleep(0.005)
    assert s.window is None and s.percent == 20.0 and calls == ["init", "shutdown"]


def test_nvml_is_shut_down_when_the_round_fails(monkeypatch):
    import nvfp4stack.bench.gpu_busy as gb

    nv, calls = _fake_nvml({0: 20})
    monkeypatch.setattr(gb, "_nvml", lambda: nv)
    with pytest.raises(RuntimeError, match="vllm bench serve: 3 of 8 requests failed"):
        with gb.busy([0], period=0.001):
            raise RuntimeError("vllm bench serve: 3 of 8 requests failed")
    assert calls == ["init", "shutdown"]


def test_polling_stops_quietly_when_the_gpu_stops_answering(monkeypatch):
    """A read that raises (NotSupported under MIG, a GPU fallen off the bus) ends the polling with the reason kept,
    not a thread traceback on every measured load; what was read before stays the figure."""
    import nvfp4stack.bench.gpu_busy as gb

    reads = iter([40.0, 60.0])

    def read():
        try:
            return next(reads)
        except StopIteration:
            raise RuntimeError("NVMLError_GpuIsLost") from None

    s = gb.Sampler(read, period=0.001).start()
    s._thread.join(timeout=5)
    assert not s._thread.is_alive() and s.samples == [40.0, 60.0] and s.percent == 50.0
    assert s.error == "RuntimeError: NVMLError_GpuIsLost"
    s.stop()
