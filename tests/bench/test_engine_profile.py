"""bench.engine_profile_batch: the server's --profiler-config (checked with vLLM's own parser) and the
profiled round's trace summary."""
import gzip
import json

import pytest

from nvfp4stack.bench import engine_profile
from nvfp4stack.cli import compose_config


def _cfg(tmp_path, *extra):
    return compose_config("recipe=tiny_v3_h200", "bench=engine", f"run_dir={tmp_path}", *extra)


def test_the_profiler_config_is_one_vllm_parses(tmp_path):
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    off = _cfg(tmp_path)
    assert engine_profile.profiled(off, tmp_path) is off          # off (the default 0): the server's config untouched
    cfg = _cfg(tmp_path, "bench.engine_profile_batch=128")
    scfg = engine_profile.profiled(cfg, tmp_path / "marlin")
    args = scfg.engine.extra_args
    assert args[-2] == "--profiler-config" and list(cfg.engine.extra_args) == list(args[:-2])
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", str(tmp_path), *args])
    pc = AsyncEngineArgs.from_cli_args(ns).profiler_config
    assert pc.profiler == "torch" and pc.torch_profiler_dir == str(tmp_path / "marlin" / "profile")
    assert (pc.delay_iterations, pc.max_iterations) == (engine_profile.PROFILE_DELAY, engine_profile.PROFILE_STEPS)
    assert pc.ignore_frontend is True and pc.torch_profiler_with_stack is False
    short = engine_profile.profiler_config(tmp_path, 8)   # an 8-token wave: a quarter skipped, half traced
    assert (short["delay_iterations"], short["max_iterations"]) == (2, 4)


def test_a_negative_profile_batch_is_refused(tmp_path):
    with pytest.raises(Exception, match="bench.engine_profile_batch: expected 0 .off. or a batch size > 0, found -1"):
        _cfg(tmp_path, "bench.engine_profile_batch=-1")


def test_the_profiled_round_summarizes_what_the_server_wrote(tmp_path, monkeypatch, capsys):
    """vllm bench serve --profile replaced by a stand-in that writes what vLLM's worker would: a gzipped trace."""
    from nvfp4stack.bench import engine_measure

    cfg = _cfg(tmp_path, "bench.engine_profile_batch=8")
    calls = []

    def fake(base_url, model, tokenizer, *, input_len, output_len, batch, seed, log):
        calls.append((batch, input_len, output_len, log.parent.name))
        with gzip.open(log.parent / "host_123.1700000000.pt.trace.json.gz", "wt") as f:
            json.dump({"traceEvents": [{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": d}
                                       for n, ts, d in (("a", 0.0, 10.0), ("b", 30.0, 5.0), ("a", 36.0, 4.0))]}, f)
        return {}

    monkeypatch.setattr(engine_measure, "bench_serve_profiled", fake)
    monkeypatch.setattr(engine_profile.time, "sleep", lambda s: None)
    out = engine_profile.profile_round(cfg, ("http://x/v1", "m", [], tmp_path), tmp_path / "ours", "round 3 ours: ")
    assert calls == [(8, cfg.bench.engine_input_len, cfg.bench.engine_output_len, "profile")]
    (name, s), = out.items()
    assert name.endswith(".pt.trace.json.gz") and s["busy_us"] == pytest.approx(19.0) and s["gaps"] == 2
    saved = json.loads((tmp_path / "ours" / "profile" / "summary.json").read_text())
    assert saved[name]["idle_us"] == pytest.approx(21.0)
    assert "GPU busy 47.5% of 0.04 ms" in (tmp_path / "ours" / "profile" / "summary.txt").read_text()
    assert "round 3 ours: profile at batch 8" in capsys.readouterr().out


def test_no_trace_is_said_in_one_line(tmp_path, monkeypatch, capsys):
    from nvfp4stack.bench import engine_measure

    monkeypatch.setattr(engine_measure, "bench_serve_profiled", lambda *a, **k: {})
    monkeypatch.setattr(engine_profile, "TRACE_WAIT_S", 0.0)
    cfg = _cfg(tmp_path, "bench.engine_profile_batch=8")
    assert engine_profile.profile_round(cfg, ("u", "m", [], tmp_path), tmp_path / "bf16", "") is None
    assert "profile: no trace under" in capsys.readouterr().out


def test_a_failed_profile_round_is_one_line_and_old_traces_are_left_out(tmp_path, monkeypatch, capsys):
    from nvfp4stack.bench import engine_measure

    cfg = _cfg(tmp_path, "bench.engine_profile_batch=8")
    prof = tmp_path / "ours" / "profile"
    prof.mkdir(parents=True)
    (prof / "old.pt.trace.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "old", "ts": 0.0, "dur": 1.0}]}))

    def refused(*a, **k):
        raise RuntimeError("vllm bench serve: 8 of 8 requests failed")

    monkeypatch.setattr(engine_measure, "bench_serve_profiled", refused)
    assert engine_profile.profile_round(cfg, ("u", "m", [], tmp_path), tmp_path / "ours", "") is None
    assert "profile: failed (RuntimeError: vllm bench serve: 8 of 8 requests failed)" in capsys.readouterr().out
    monkeypatch.setattr(engine_measure, "bench_serve_profiled", lambda *a, **k: {})
    monkeypatch.setattr(engine_profile, "TRACE_WAIT_S", 0.0)
    assert engine_profile.profile_round(cfg, ("u", "m", [], tmp_path), tmp_path / "ours", "") is None   # old only
    assert not (prof / "summary.json").exists()
