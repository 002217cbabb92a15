"""The client side of bench=engine without a server: which `vllm bench serve` rounds a measurement sends."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def sent(monkeypatch):
    """_bench_serve_once stand-in: logs (concurrency, prompts, seed) and answers figures that differ per load."""
    import nvfp4stack.bench.engine_measure as em

    sent_log = []

    def once(base_url, model, tokenizer, *, input_len, output_len, prompts, concurrency, seed, log):
        sent_log.append((concurrency, prompts, seed))
        return {"output_throughput": 100.0 * concurrency + seed, "median_tpot_ms": 1.0 + concurrency / 100,
                "total_input_tokens": prompts * input_len, "duration": 2.0, "median_ttft_ms": 50.0}

    monkeypatch.setattr(em, "_bench_serve_once", once)
    return sent_log


def _cfg(tmp_path):
    from nvfp4stack.cli import compose_config

    return compose_config("recipe=tiny_v3_h200", "bench=engine", "bench.engine_batches=[1,8]",
                          "bench.engine_prefill_prompts=4", f"run_dir={tmp_path}")


@pytest.mark.parametrize("warm_up", [True, False])
def test_a_round_warms_up_each_load_on_other_prompts_unless_told_not_to(tmp_path, sent, warm_up):
    from nvfp4stack.bench.engine_measure import measure, round_seed

    cfg = _cfg(tmp_path)
    out = measure(cfg, "http://127.0.0.1:1/v1", "m", Path("."), tmp_path / "log", rnd=2, warm_up=warm_up)
    seed = round_seed(cfg.bench.seed, 2)
    waves = cfg.bench.engine_decode_waves
    loads = [(1, waves), (8, 8 * waves), (cfg.bench.engine_prefill_concurrency, 4)]
    expected = [(c, p, s) for c, p in loads for s in ((seed + 1, seed) if warm_up else (seed,))]
    assert sent == expected                     # the measured round last at each load
    assert out["decode b=8 tok/s"] == 800.0 + seed and out["decode b=1 TPOT ms"] == 1.01   # the measured round's
    assert out[f"prefill {cfg.bench.engine_prefill_len} tok/s"] == 4 * cfg.bench.engine_prefill_len / 2.0


def test_the_measured_round_keeps_the_gpus_busy_share_where_nvml_gives_one(tmp_path, sent, monkeypatch, capsys):
    import contextlib
    import types

    import nvfp4stack.bench.engine_measure as em

    watched = []

    @contextlib.contextmanager
    def busy(devices):
        s = types.SimpleNamespace(percent=None)   # a figure exists only once the block has ended
        entered = len(sent)
        yield s
        watched.append((tuple(devices), entered, len(sent)))   # which GPUs; the rounds sent before and after
        s.percent = 37.5

    monkeypatch.setattr(em, "busy", busy)
    cfg = _cfg(tmp_path)
    out = em.measure(cfg, "http://127.0.0.1:1/v1", "m", Path("."), tmp_path / "log", label="r: ")
    assert watched == [((0,), 1, 2), ((0,), 3, 4), ((0,), 5, 6)]   # around each measured round only, not the warm-ups
    assert out["decode b=1 GPU busy %"] == out["decode b=8 GPU busy %"] == 37.5
    assert out[f"prefill {cfg.bench.engine_prefill_len} GPU busy %"] == 37.5
    assert "r: decode batch 8: 800 tok/s, TPOT 1.08 ms, GPU busy 38%" in capsys.readouterr().out


def test_no_nvml_no_busy_metric(tmp_path, sent, monkeypatch):
    import contextlib
    import types

    import nvfp4stack.bench.engine_measure as em

    monkeypatch.setattr(em, "busy", contextlib.contextmanager(lambda devices: (yield types.SimpleNamespace(percent=None))))
    out = em.measure(_cfg(tmp_path), "http://127.0.0.1:1/v1", "m", Path("."), tmp_path / "log")
    assert not any(k.endswith("GPU busy %") for k in out) and "decode b=1 tok/s" in out


@pytest.mark.parametrize("tp, dp, env, caller, want", [
    (1, 1, {}, None, (0,)),
    (2, 1, {}, None, (0, 1)),
    (2, 2, {}, None, (0, 1, 2, 3)),
    (2, 1, {"CUDA_VISIBLE_DEVICES": "2,3"}, None, (2, 3)),      # the server's own env
    (1, 1, {}, "5, 6", (5,)),                                   # else the caller's
    (2, 1, {"CUDA_VISIBLE_DEVICES": "3,1"}, "5,6", (3, 1)),     # the server's wins
    (2, 1, {"CUDA_VISIBLE_DEVICES": "GPU-8e6f,GPU-1a2b"}, None, (0, 1)),   # UUIDs: not indices
    (2, 1, {"CUDA_VISIBLE_DEVICES": "4"}, None, (0, 1)),         # too few for the ranks
])
def test_the_servers_gpus_follow_its_ranks_and_cuda_visible_devices(monkeypatch, tp, dp, env, caller, want):
    import types

    from nvfp4stack.bench.engine_measure import server_gpus

    if caller is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", caller)
    assert server_gpus(types.SimpleNamespace(tp=tp, dp=dp, env=env)) == want
