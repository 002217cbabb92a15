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
