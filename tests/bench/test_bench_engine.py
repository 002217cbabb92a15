"""``bench=engine``: settings change only their keys; the table's speed-ups point the right way;
and the whole benchmark runs live on CPU (two vLLM servers, vLLM's own ``bench serve``)."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.bench.engine import SETTINGS, check_settings, speedup, table

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path("~/.cache/nvfp4stack").expanduser()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_setting_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"bench.engine_settings: expected one or more of .*marlin.*found \['cutlass'\]"):
        check_settings(["cutlass"])


def test_settings_change_only_their_keys(tmp_path):
    from nvfp4stack.cli import compose_config

    cfg = compose_config("recipe=tiny_v3_h200", "engine.max_model_len=4096", f"run_dir={tmp_path}")
    fp8 = SETTINGS["triton_w4a16+fp8"].apply(cfg, tmp_path / "q", tmp_path / "run", 8123)
    assert (fp8.backend.moe, fp8.backend.moe_fp8_prefill, fp8.model.path) == ("triton_w4a16", True, str(tmp_path / "q"))
    assert (fp8.engine.port, fp8.engine.max_model_len, fp8.engine.dtype) == (8123, 4096, cfg.engine.dtype)
    assert fp8.precision == cfg.precision and fp8.arch == cfg.arch
    bf16 = SETTINGS["bf16"].apply(cfg, None, tmp_path / "run", 8124)
    assert bf16.precision.routed_experts == "bf16" and bf16.backend.moe == cfg.backend.moe
    assert bf16.model == cfg.model and bf16.run_dir == str(tmp_path / "run")
    marlin = SETTINGS["marlin"].apply(cfg, None, tmp_path / "run", 8125)
    assert marlin.backend.moe == "marlin" and not marlin.backend.moe_fp8_prefill


def test_table_speedups_are_ours_over_baseline_for_throughput_and_inverse_for_latency():
    results = {"triton_w4a16": {"decode b=8 tok/s": 3000.0, "decode b=8 TPOT ms": 2.0},
               "marlin": {"decode b=8 tok/s": 2000.0, "decode b=8 TPOT ms": 3.0},
               "bf16": {"decode b=8 tok/s": 1500.0, "decode b=8 TPOT ms": 5.0}}
    rows = {r["metric"]: r for r in table(results)}
    assert rows["decode b=8 tok/s"]["triton_w4a16/marlin"] == 1.5
    assert rows["decode b=8 tok/s"]["triton_w4a16/bf16"] == 2.0
    assert rows["decode b=8 TPOT ms"]["triton_w4a16/marlin"] == 1.5
    assert rows["decode b=8 TPOT ms"]["triton_w4a16/bf16"] == 2.5
    assert "marlin/bf16" not in rows["decode b=8 tok/s"]   # baselines are not compared with each other
    assert speedup("engine ready s", 200.0, 100.0) == 0.5


@pytest.mark.slow
def test_engine_bench_runs_live_on_cpu(tmp_path, request):
    """The recipe's server per setting (ours on CPU and vLLM's bf16 MoE), vLLM's bench serve against it,
    one table: every cell measured and positive, the bf16 server built no nvfp4stack method."""
    pytest.importorskip("vllm")
    request.getfixturevalue("trained_default")  # a cold cache trains here, before the ready deadline starts
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "main.py", "bench", "bench=engine", "bench.engine_model=recipe",
           "bench.engine_settings=[torch_emulation,bf16]", "bench.engine_batches=[1,4]", "bench.engine_decode_waves=2",
           "bench.engine_input_len=16", "bench.engine_output_len=8", "bench.engine_prefill_len=64",
           "bench.engine_prefill_prompts=2", "bench.engine_prefill_concurrency=2",
           f"engine.port={free_port()}", f"run_dir={run_dir}", f"cache_dir={CACHE}", "engine.ready_timeout_s=900"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Engine benchmark" in r.stdout and "torch_emulation/bf16" in r.stdout
    m = json.loads((run_dir / "metrics.json").read_text())
    assert set(m["results"]) == {"torch_emulation", "bf16"}
    for name, res in m["results"].items():
        assert set(res) == {"engine ready s", "decode b=1 tok/s", "decode b=1 TPOT ms", "decode b=4 tok/s",
                            "decode b=4 TPOT ms", "prefill 64 tok/s", "prefill 64 TTFT ms"}, name
        assert all(v > 0 for v in res.values()), (name, res)
    assert "--quantization nvfp4stack" in m["commands"]["torch_emulation"]
    assert "--quantization" not in m["commands"]["bf16"]  # vLLM's own unquantized MoE: no plugin config
    bf16_log = (run_dir / "bf16" / "vllm_server.log").read_text(errors="replace")
    assert "Nvfp4StackModelOptMoE" not in bf16_log
    emu_log = (run_dir / "torch_emulation" / "vllm_server.log").read_text(errors="replace")
    assert "-> Nvfp4StackModelOptMoE" in emu_log


def test_a_setting_measured_earlier_is_reused_only_with_the_same_keys_engine_and_device(tmp_path):
    """One setting per GPU-host visit: a rerun into the same run_dir picks up what is already measured."""
    from nvfp4stack.bench.engine import _device, _engine_key, _saved
    from nvfp4stack.cli import compose_config

    cfg = compose_config("recipe=tiny_v3_h200", f"run_dir={tmp_path}")
    scfg = SETTINGS["marlin"].apply(cfg, tmp_path / "q", tmp_path / "marlin", 8000)
    keys = {"engine_batches": [1, 8], "engine_output_len": 128}
    (tmp_path / "marlin").mkdir()
    (tmp_path / "marlin" / "result.json").write_text(json.dumps(
        {"keys": keys, "engine": _engine_key(scfg), "device": _device(), "command": "vllm serve ...",
         "results": {"decode b=1 tok/s": 123.0}}))
    assert _saved(tmp_path / "marlin", keys, scfg)["results"] == {"decode b=1 tok/s": 123.0}
    assert _saved(tmp_path / "marlin", {**keys, "engine_output_len": 64}, scfg) is None
    other_port = SETTINGS["marlin"].apply(cfg, tmp_path / "q", tmp_path / "marlin", 9000)
    assert _saved(tmp_path / "marlin", keys, other_port) is not None          # the port decides nothing
    other_model = SETTINGS["marlin"].apply(cfg, tmp_path / "q2", tmp_path / "marlin", 8000)
    assert _saved(tmp_path / "marlin", keys, other_model) is None
    assert _saved(tmp_path / "nothing", keys, scfg) is None


def test_decode_waves_below_one_is_refused_with_the_fix():
    from nvfp4stack.bench.config import BenchConfig

    with pytest.raises(ValueError, match=r"bench.engine_decode_waves: expected >= 1.*found 0.*fix"):
        BenchConfig(name="engine", engine_decode_waves=0)
