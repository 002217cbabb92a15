"""The table of a bench=engine run (nvfp4stack/bench/engine_table.py), on hand-written rounds."""
from __future__ import annotations


def test_a_busy_share_gets_no_speed_up_and_low_cells_are_named_host_bound():
    from nvfp4stack.bench.engine_table import host_bound_line, spread_lines, table

    results = {   # bf16 busy at batch 32, everything at batch 1 host-bound (the 2026-11-28 H200 picture)
        "triton_w4a16": {"decode b=1 TPOT ms": [1.8, 1.9, 2.0], "decode b=1 GPU busy %": [30.0, 35.0, 60.0],
                         "decode b=32 TPOT ms": [2.9, 2.9, 3.0], "decode b=32 GPU busy %": [70.0, 75.0, 90.0]},
        "bf16": {"decode b=1 TPOT ms": [1.9, 2.2, 2.6], "decode b=1 GPU busy %": [40.0, 42.0, 45.0],
                 "decode b=32 TPOT ms": [5.77, 5.79, 5.77], "decode b=32 GPU busy %": [97.0, 98.0, 99.0]},
    }
    rows = {r["metric"]: r for r in table(results)}
    assert "triton_w4a16/bf16" not in rows["decode b=32 GPU busy %"]          # a share, not a speed
    assert rows["decode b=32 TPOT ms"]["triton_w4a16/bf16"] == "1.99"
    assert rows["decode b=32 GPU busy %"]["bf16"] == "98.0 [97.0-99.0] 2.0%"
    assert host_bound_line(results) == ("host-bound (GPU busy under 80% of the round; a kernel difference cannot "
                                        "show there): triton_w4a16 decode b=1 (35.0%); triton_w4a16 decode b=32 (75.0%); "
                                        "bf16 decode b=1 (42.0%)")
    assert spread_lines(results) == [   # the busy share (30-60%: 86%) is not a repeat of a speed
        "triton_w4a16: worst 10.5% (decode b=1 TPOT ms, 3 rounds), OVER the 5% goal",
        "bf16: worst 31.8% (decode b=1 TPOT ms, 3 rounds), OVER the 5% goal"]
    assert host_bound_line({"bf16": {"decode b=32 GPU busy %": [97.0]}}) is None
    assert host_bound_line({"bf16": {"decode b=32 GPU busy %": [79.0, 80.0, 95.0]}}) is None   # 80% itself: busy
    assert host_bound_line({"bf16": {"decode b=32 GPU busy %": [70.0, 79.9, 95.0]}}).endswith("bf16 decode b=32 (79.9%)")
    assert host_bound_line({"bf16": {"decode b=32 TPOT ms": [5.8]}}) is None     # no NVML, no verdict


def test_the_step_time_spread_is_named_beside_a_worse_throughput_spread():
    from nvfp4stack.bench.engine_table import spread_lines

    results = {   # made up after the 32-layer run's shape: tok/s counts each wave's ramp, TPOT only the steps
        "triton_w4a16": {"decode b=8 tok/s": [873.0, 1016.0, 1017.0], "decode b=8 TPOT ms": [7.45, 7.55, 7.55],
                         "decode b=256 TPOT ms": [19.1, 19.7, 20.1], "prefill 2048 TTFT ms": [570.0, 575.0, 582.0],
                         "decode b=8 GPU busy %": [84.0, 93.0, 95.0]},
        "marlin": {"decode b=8 tok/s": [801.0, 847.0, 860.0], "decode b=8 TPOT ms": [9.07, 9.09, 9.12],
                   "decode b=256 TPOT ms": [24.5, 24.7, 25.9]},
        "humming": {"decode b=1 tok/s": [197.0, 199.0, 199.0]},   # no TPOT measured: no second clause
    }
    assert spread_lines(results) == [
        "triton_w4a16: worst 14.2% (decode b=8 tok/s, 3 rounds), OVER the 5% goal; "
        "decode step time worst 5.1% (decode b=256 TPOT ms, 3 rounds), OVER the 5% goal",
        "marlin: worst 7.0% (decode b=8 tok/s, 3 rounds), OVER the 5% goal; "
        "decode step time worst 5.7% (decode b=256 TPOT ms, 3 rounds), OVER the 5% goal",
        "humming: worst 1.0% (decode b=1 tok/s, 3 rounds), within the 5% goal"]
    results["marlin"]["decode b=256 TPOT ms"] = [24.5, 24.7, 25.0]
    assert spread_lines(results)[1].endswith("decode step time worst 2.0% (decode b=256 TPOT ms, 3 rounds), within "
                                             "the 5% goal")


def test_the_spread_lines_of_the_32_layer_run_are_those_results_quotes():
    import json
    from pathlib import Path

    from nvfp4stack.bench.engine_table import spread_lines

    data = Path(__file__).resolve().parents[2] / "bench" / "data" / "engine_32_layers_h200_2026-11-28"
    lines = spread_lines(json.loads((data / "metrics.json").read_text())["results"])
    assert lines == [
        "triton_w4a16: worst 14.2% (decode b=8 tok/s, 3 rounds), OVER the 5% goal; "
        "decode step time worst 4.8% (decode b=256 TPOT ms, 3 rounds), within the 5% goal",
        "marlin: worst 7.3% (decode b=32 tok/s, 3 rounds), OVER the 5% goal; "
        "decode step time worst 4.9% (decode b=256 TPOT ms, 3 rounds), within the 5% goal",
        "humming: worst 8.0% (decode b=8 tok/s, 3 rounds), OVER the 5% goal; "
        "decode step time worst 2.3% (decode b=256 TPOT ms, 3 rounds), within the 5% goal"]
    fp8 = spread_lines(json.loads((data / "metrics_fp8_prefill.json").read_text())["results"])
    assert fp8 == ["triton_w4a16+fp8: worst 17.7% (prefill 2048 TTFT ms, 3 rounds), OVER the 5% goal; "
                   "decode step time worst 7.5% (decode b=256 TPOT ms, 3 rounds), OVER the 5% goal"]


def test_the_ready_line_says_when_the_first_start_paid_the_shared_jit():
    import json
    from pathlib import Path

    from nvfp4stack.bench.engine_table import ready_line, table

    data = Path(__file__).resolve().parents[2] / "bench" / "data" / "engine_drawn_32_layers_all_batches_h200_2026-11-28"
    run = json.loads((data / "metrics.json").read_text())
    assert run["server_starts"] == ["triton_w4a16", "bf16"] and run["config"]["engine_cold_caches"] is False
    line = ready_line(run["server_starts"], run["config"]["engine_cold_caches"])
    assert line.startswith("ready times: JIT caches shared between starts") and "(triton_w4a16)" in line
    assert "bench.engine_cold_caches=true" in line
    ready = {r["metric"]: r for r in table(run["results"])}["engine ready s"]
    assert ready["triton_w4a16/bf16"] == "0.49"   # the ratio the line qualifies: 224 s (first start) vs 109 s
    assert ready_line(run["server_starts"], True) is None      # every start on empty caches of its own
    assert ready_line(["triton_w4a16"], False) is None         # one start: nothing to compare
    assert "FlashInfer's sampling module, 75-100 s" in line and "environment" not in run   # recorded since


def test_the_ready_line_says_so_when_flashinfers_sampler_was_off():
    import json
    from pathlib import Path

    from nvfp4stack.bench.engine_table import ready_line

    data = Path(__file__).resolve().parents[2] / "bench" / "data" / "engine_drawn_32_layers_fp8_marlin_bf16_h200_2026-11-28"
    run = json.loads((data / "metrics.json").read_text())
    starts = run["server_starts"]
    assert starts == ["triton_w4a16+fp8", "marlin", "bf16"]
    off = ready_line(starts, False, {"VLLM_USE_FLASHINFER_SAMPLER": "0"})   # that run's shell set it
    assert "(triton_w4a16+fp8)" in off and "VLLM_USE_FLASHINFER_SAMPLER=0" in off and "75-100 s" not in off
    assert ready_line(starts, False, {"VLLM_USE_FLASHINFER_SAMPLER": "1"}) == ready_line(starts, False)
    assert ready_line(starts, False, {"VLLM_USE_FLASHINFER_SAMPLER": "00"}) == off   # as vLLM reads it: int()
