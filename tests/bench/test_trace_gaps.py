"""trace_gaps: the GPU's busy share, largest kernels and idle gaps of a torch profiler trace."""
import gzip
import json

import pytest

from nvfp4stack.bench.trace_gaps import format_steps, format_summary, load_events, main, steps, summarize


def k(name: str, ts: float, dur: float, stream: int = 7) -> dict:
    """A kernel event as CUPTI's trace writes it."""
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream}


def _trace():
    """Two streams, overlapping kernels, gaps of 1, 5, 40 and 250 us, and CPU events that must not count."""
    return {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 5000.0},          # host: ignored
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 90.0, "dur": 3.0},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 95.0},                          # not a span: ignored
        k("embed", 100.0, 10.0),                          # 100-110
        k("l1_swiglu_decode_kernel", 111.0, 30.0),        # gap 1 us; 111-141
        k("ring_side", 120.0, 40.0, stream=9),            # side stream, overlaps: 120-160
        k("l2_decode_kernel", 165.0, 20.0),               # gap 5 us after ring_side; 165-185
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 185.0, "dur": 2.5},   # 185-187.5
        k("l1_swiglu_decode_kernel", 227.5, 30.0),        # gap 40 us; 227.5-257.5
        k("argmax", 507.5, 12.5),                         # gap 250 us; 507.5-520
    ]}


def test_summary_counts_the_union_and_puts_each_gap_between_its_kernels(tmp_path):
    path = tmp_path / "worker.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(_trace(), f)
    ev = load_events(path)
    assert len(ev) == 7 and {e["name"] for e in ev} >= {"ring_side", "Memset (Device)"}
    s = summarize(ev)
    assert s["window_us"] == pytest.approx(420.0)
    assert s["idle_us"] == pytest.approx(1 + 5 + 40 + 250)
    assert s["busy_us"] == pytest.approx(420.0 - 296.0) and s["busy_share"] == pytest.approx(124 / 420)
    assert s["gaps"] == 4
    assert s["idle_by_gap_size_us"] == {"0-2 us": pytest.approx(1.0), "2-10 us": pytest.approx(5.0),
                                        "10-100 us": pytest.approx(40.0), "100-inf us": pytest.approx(250.0)}
    pairs = [(p["before"], p["after"], p["count"], p["total_us"]) for p in s["idle_by_neighbours"]]
    assert pairs[0] == ("l1_swiglu_decode_kernel", "argmax", 1, pytest.approx(250.0))
    assert ("ring_side", "l2_decode_kernel", 1, pytest.approx(5.0)) in pairs   # the side stream ended last
    assert ("Memset (Device)", "l1_swiglu_decode_kernel", 1, pytest.approx(40.0)) in pairs
    top = s["kernels"][0]
    assert (top["name"], top["count"], top["total_us"]) == ("l1_swiglu_decode_kernel", 2, pytest.approx(60.0))
    assert sum(k["share"] for k in s["kernels"]) == pytest.approx(1.0)
    text = format_summary(s)
    assert text.startswith("GPU busy 29.5% of 0.42 ms (7 events, 4 idle gaps")
    assert "l1_swiglu_decode_kernel -> argmax" in text


def test_a_trace_without_gpu_events_says_so(tmp_path, capsys):
    path = tmp_path / "cpu.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 9}]}))
    assert summarize(load_events(path)) == {"events": 0}
    assert main([str(path)]) == 0
    assert "no GPU kernel, memcpy or memset events" in capsys.readouterr().out


def test_odd_events_are_read_or_left_out_not_fatal(tmp_path):
    """A list at the top, a nameless kernel, times as strings, zero-length and malformed events."""
    path = tmp_path / "odd.json"
    path.write_text(json.dumps([
        {"ph": "X", "cat": "kernel", "ts": "10", "dur": "5"},                 # no name, strings: read
        {"ph": "X", "cat": "kernel", "name": "z", "ts": 12.0, "dur": 0},       # no time on the GPU: left out
        {"ph": "X", "cat": "kernel", "name": "bad", "ts": "soon", "dur": 3},   # left out
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 20.0, "dur": 2.0},
    ]))
    ev = load_events(path)
    assert [(e["name"], e["ts"], e["dur"]) for e in ev] == [("?", 10.0, 5.0), ("Memcpy HtoD", 20.0, 2.0)]
    s = summarize(ev)
    assert s["busy_us"] == pytest.approx(7.0) and s["idle_by_neighbours"][0]["before"] == "?"
    assert summarize([{"name": "z", "ts": 1.0, "dur": 0.0}]) == {"events": 0}
    (tmp_path / "scalar.json").write_text("3")
    assert load_events(tmp_path / "scalar.json") == []


def test_steps_cut_at_the_named_kernel_and_time_each_one(tmp_path, capsys):
    """Three step-start launches: a side stream inside the first cycle, a side kernel of step 1 still running when
    step 2 starts, a pre-trace event. Each cycle runs launch to launch; its idle time is the cycle less the union
    of the GPU's activity (streams once), clipped to the cycle; the CLI prints them and the left-out events."""
    emb = "triton_red_fused__to_copy_embedding_rms_norm_0"
    trace = {"traceEvents": [
        k("before_any_step", -50.0, 5.0),
        k(emb, 0.0, 3.0),                                                   # step 0: cycle 0-96
        k("l1_swiglu_wgmma_kernel", 4.0, 60.0), k("nvjet_shared", 10.0, 30.0), k("l2_wgmma_kernel", 65.0, 25.0),
        k(emb, 96.0, 3.0),                                                  # step 1: cycle 96-280
        k("l1_swiglu_wgmma_kernel", 100.0, 70.0), k("l2_wgmma_kernel", 171.0, 29.0),
        k("side_tail", 270.0, 20.0),                                        # runs past step 2's start
        k(emb, 280.0, 2.0),                                                 # step 2: to the last end, 295
        k("argmax", 290.0, 5.0),
    ]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    st = steps(load_events(path), "embedding")
    assert [s["step"] for s in st] == [0, 1, 2] and [s["last"] for s in st] == [False, False, True]
    assert [s["cycle_us"] for s in st] == pytest.approx([96.0, 184.0, 15.0])
    # step 0 busy 0-3, 4-64, 65-90: idle 1 + 1 + 6; step 1 busy 96-99, 100-170, 171-200, 270-280: idle 1 + 1 + 70;
    # step 2 busy 280-282 (and side_tail's 280-290 belongs to step 1's list, not counted here), 290-295: idle 8
    assert [s["idle_us"] for s in st] == pytest.approx([8.0, 72.0, 8.0])
    assert [s["kernel_us"] for s in st] == pytest.approx([118.0, 122.0, 7.0])
    assert st[1]["by_kernel_us"] == {emb: 3.0, "l1_swiglu_wgmma_kernel": 70.0, "l2_wgmma_kernel": 29.0,
                                     "side_tail": 20.0}
    text = format_steps(st, before=1)
    assert "3 steps" in text and "1 events before the first step left out" in text
    assert "l1_swiglu_wgmma_kernel" in text.splitlines()[5]  # the largest mean first
    assert steps(load_events(path), "no such kernel") == [] and "no step" in format_steps([])
    assert main([str(path), "--step-start", "embedding"]) == 0
    out = capsys.readouterr().out
    assert "GPU busy" in out and "3 steps" in out and "72.0" in out and "1 events before the first step" in out
