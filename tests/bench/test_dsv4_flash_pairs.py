"""bench/dsv4_flash_pairs.sh (issue #34's four-GPU visit; phases tp2, ep, both and ref) on stand-ins: a fake `main.py serve` that
says "engine ready" and waits for Ctrl-C, a fake client and nvidia-smi. Checks the orchestration the
GPU time depends on: both servers of a pair start on their own GPUs, ports and caches; clients run
ours, stock, stock, ours; every server is stopped; nothing is written into the device tool's $OUT."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_SERVE = r'''
import os, signal, sys, time
run_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("run_dir="))
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, "vllm_server.log"), "w") as f:
    f.write("INFO Model loading took 74.06 GiB memory\nINFO nvfp4stack: x -> Nvfp4StackMxfp4CastMoE\n")
print("args", *sys.argv[1:], "| GPUs", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "| tilelang", os.environ.get("TILELANG_CACHE_DIR"), "| dg", os.environ.get("DG_JIT_CACHE_DIR"),
      "| warmup", os.environ.get("VLLM_DEEP_GEMM_WARMUP"), flush=True)
for a in sys.argv:   # vLLM's profiler (PROFILE_DIR): a rank's table, as vLLM writes it at /stop_profile
    if "torch_profiler_dir=" in a:
        d = a.split("torch_profiler_dir=", 1)[1].split("'")[0]
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "profiler_out_0.txt"), "w").write("Name  Self CUDA\nl1_swiglu_wgmma_kernel  1.0ms\n")
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
time.sleep(1)
print("engine ready", flush=True)
while True:
    time.sleep(0.2)
'''

FAKE_CLIENT = r'''
import json, os, runpy, sys
if sys.argv[1:2] in (["compare"], ["ratio"]):   # the real comparison, on the stand-in runs' JSON
    runpy.run_path(os.environ["REAL_CLIENT"], run_name="__main__")
if sys.argv[1:2] == ["profile"]:
    print("profiled one", sys.argv[4], "token prefill at", sys.argv[2], flush=True)
    sys.exit(0)
args = sys.argv[1:]
out = args[args.index("--json") + 1]
print("client", args[args.index("--base-url") + 1], flush=True)
if "--skip-teacher-forced" in args:
    print("teacher-forced scoring skipped:", args[args.index("--skip-teacher-forced") + 1], flush=True)
json.dump({"greedy": [{"prompt_len": 1, "token_ids": [7, 8], "tokens": None, "logprobs": [-1.0, -2.0]}],
           "teacher_forced": [{"prompt_len": 2, "own_logprob": [-1.5], "top1": [7]}],
           "decode": {"1": {"median": 100.0, "min": 99.0, "max": 101.0}}}, open(out, "w"))
'''


def _start_pairs(tmp_path, phases: str, **extra: str):
    """The orchestrator on stand-ins, started in the background; returns (process, FLASH_OUT, the device tool's $OUT)."""
    tree = tmp_path / "tree"
    (tree / "bench").mkdir(parents=True)
    (tree / "nvfp4stack" / "bundle").mkdir(parents=True)
    for f in ("bench/dsv4_flash_pairs.sh", "bench/dsv4_flash_serve.sh", "nvfp4stack/bundle/gpu_host.sh"):
        shutil.copy(ROOT / f, tree / f)
    (tree / "main.py").write_text(FAKE_SERVE)
    (tree / "bench" / "dsv4_flash_run.py").write_text(FAKE_CLIENT)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 1 MiB'\n")
    smi.chmod(0o755)
    device_out = tmp_path / "device_out"   # what the device tool calls $OUT: must stay untouched
    device_out.mkdir()
    flash = tmp_path / "flash"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SITE": str(tmp_path),
           "OUT": str(device_out), "FLASH_OUT": str(flash), "PHASES": phases, "READY_TIMEOUT_S": "60",
           "REAL_CLIENT": str(ROOT / "bench" / "dsv4_flash_run.py"), **extra}
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(["bash", "bench/dsv4_flash_pairs.sh"], cwd=tree, env=env, stdout=out, stderr=err,
                                text=True)
    return proc, flash, device_out


def _scoring_skipped(flash: Path) -> list[str]:
    """The lines in which a client run said it scored no prompt (the clients print into pairs.log)."""
    return [line for line in (flash / "pairs.log").read_text().splitlines()
            if line.startswith("teacher-forced scoring skipped:")]


def _finish(proc, tmp_path, timeout_s: float) -> subprocess.CompletedProcess:
    try:
        proc.wait(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, (tmp_path / "stdout.txt").read_text(),
                                       (tmp_path / "stderr.txt").read_text())


# Every orchestrator run the tests below check: (PHASES, more environment). Each only waits (stand-in servers,
# the scripts' 1 s polls, the reaping of a stopped server), so the fixture `pairs` starts them all side by side,
# each in its own directory, and a test reads its own runs: the file takes its slowest run's time, not the sum.
RUNS = {
    "abba": ("tp2 ep ref", {}),
    "pair_late": ("tp2", {"PHASE_S": "10", "MEASURE_S": "100000"}),
    "ref_one_gpu": ("ref", {"REF_GPUS": "0 0 0"}),
    "both": ("both", {}),
    "seq": ("seq", {}),
    "seq_shared": ("seq", {"SEQ_SHARED_CACHES": "1"}),
    "seq_late": ("seq", {"PHASE_S": "99999"}),
    "seqep": ("seqep", {"SEQ_SHARED_CACHES": "1"}),
    "seqep_profile": ("seqep", {"PROFILE": "1"}),
    "seqep_late": ("seqep", {"PHASE_S": "10", "MEASURE_S": "100000"}),
    "pair_profile": ("ep", {"PROFILE": "1"}),
    "tp4": ("tp4", {}),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """``pairs(name)`` -> (result, FLASH_OUT, the device tool's $OUT) of RUNS[name], as a run of its own gives them."""
    import time

    started = {}
    for name, (phases, extra) in RUNS.items():
        tmp = tmp_path_factory.mktemp(f"pairs_{name}_")
        started[name] = (tmp, *_start_pairs(tmp, phases, **extra))
    deadline = time.monotonic() + 240
    done = {}

    def result(name):
        if name not in done:
            tmp, proc, flash, device_out = started[name]
            done[name] = (_finish(proc, tmp, deadline - time.monotonic()), flash, device_out)
        return done[name]
    yield result
    for tmp, proc, _, _ in started.values():
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_pairs_start_side_by_side_measure_abba_and_stop(pairs):
    r, flash, device_out = pairs("abba")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert list(device_out.iterdir()) == []
    measured = [line.split("measure ")[1] for line in log.splitlines() if "] measure " in line]   # pairs only
    assert measured == ["ours-tp2 round 1", "stock-tp2 round 1", "stock-tp2 round 2", "ours-tp2 round 2",
                        "ours-ep round 1", "stock-ep round 1", "stock-ep round 2", "ours-ep round 2"]
    assert "ours-tp2: ready after" in log and "stock-ep: ready after" in log and "all done" in log
    assert "ours/stock, tp2, round 2" in log and "ours/stock, ep, round 1" in log
    assert "decode batch 1: 1.00x (100.0 vs 100.0 tok/s, ranges 99.0-101.0 vs 99.0-101.0): within noise" in log
    assert "-> Nvfp4Stack" not in log and "Model loading took 74.06 GiB" in log
    ours = (flash / "ours-ep.serve.log").read_text()
    stock = (flash / "stock-ep.serve.log").read_text()
    assert "engine.ep=true" in ours and "backend.moe=triton_w4a16" in ours and "| GPUs 0,1 " in ours
    assert "backend.moe=marlin" in stock and "| GPUs 2,3 " in stock and "cache-stock/tilelang" in stock
    assert "engine.port=8011" in ours and "engine.port=8012" in stock
    assert sorted(p.name for p in flash.glob("*.json")) == sorted(
        [f"{who}-{phase}-r{n}.json" for who in ("ours", "stock") for phase in ("tp2", "ep") for n in (1, 2)]
        + ["ours-ref-r1.json", "stock-ref-r1.json", "fp32-ref-r1.json"])
    ref = (flash / "fp32-ref.serve.log").read_text()
    assert all(k in ref for k in ("backend.moe=torch_emulation", "engine.enforce_eager=true", "model.num_layers=8",
                                  "engine.tp=1", "| GPUs 2 "))
    assert "ours against the fp32 reference MoE" in log and "stock against the fp32 reference MoE" in log
    assert "ours against stock" in log
    assert log.count("teacher-forced, 1 positions: top-1 token equal at 1 (100.0%)") == 3
    assert _scoring_skipped(flash) == []   # no draft: every prompt scored
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(flash / "runs") not in ps   # every server stopped


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_a_pairs_second_rounds_are_left_out_when_the_deadline_is_near(pairs):
    r, flash, _ = pairs("pair_late")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    measured = [line.split("measure ")[1] for line in log.splitlines() if "] measure " in line]
    assert measured == ["ours-tp2 round 1", "stock-tp2 round 1"]
    assert "skip stock-tp2 round 2: under 100000 s (MEASURE_S)" in log and "skip ours-tp2 round 2" in log
    assert "phase tp2 done" in log and sorted(p.name for p in flash.glob("*.json")) == ["ours-tp2-r1.json",
                                                                                        "stock-tp2-r1.json"]


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_ref_on_one_gpu_runs_the_three_servers_in_turn(pairs):
    """REF_GPUS="0 0 0" (a one-GPU host): each server is stopped before the next one starts, all on GPU 0,
    sharing one compile cache, and the three comparisons are printed."""
    r, flash, device_out = pairs("ref_one_gpu")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert list(device_out.iterdir()) == []
    events = [line.split("] ", 1)[1] if "] " in line else line for line in log.splitlines()
              if ": started (pid" in line or ": ready after" in line]
    tags = [e.split(":")[0] for e in events]
    assert tags == ["ours-ref", "ours-ref", "stock-ref", "stock-ref", "fp32-ref", "fp32-ref"], events
    for tag in ("ours-ref", "stock-ref", "fp32-ref"):
        served = (flash / f"{tag}.serve.log").read_text()
        assert "| GPUs 0 " in served and "cache-ref/tilelang" in served
        assert '"cudagraph_capture_sizes":[1,8]' in served and "engine.max_num_seqs=8" in served
    assert log.count("teacher-forced, 1 positions: top-1 token equal at 1 (100.0%)") == 3
    assert _scoring_skipped(flash) == []   # no draft: every prompt scored
    assert "phase ref done" in log and "all done" in log
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(flash / "runs") not in ps


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_both_keeps_one_stock_server_for_tp2_and_ep(pairs):
    """Phase both: ours (TP=2) and stock start together; after ours and stock are measured, ours restarts
    with EP on its own GPUs while the same stock server stays up and is measured again; one DeepGEMM cache
    for both servers, vLLM's DeepGEMM warm-up (relax), every other cache per server."""
    r, flash, device_out = pairs("both")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert list(device_out.iterdir()) == []
    events = [line.split("] ", 1)[1] if "] " in line else line for line in log.splitlines()
              if "] measure " in line or ": started (pid" in line]
    assert [e.split(" (pid")[0] for e in events] == [
        "ours-tp2: started", "stock-tp2: started", "measure ours-tp2", "measure stock-tp2 round 1",
        "ours-ep: started", "measure ours-ep", "measure stock-tp2 round 2"], events
    ours, ep, stock = ((flash / f"{t}.serve.log").read_text() for t in ("ours-tp2", "ours-ep", "stock-tp2"))
    assert "engine.ep=false" in ours and "engine.ep=true" in ep and "| GPUs 0,1 " in ep and "| GPUs 2,3 " in stock
    assert "backend.moe=marlin" in stock and "backend.moe=triton_w4a16" in ep
    for served in (ours, ep, stock):
        assert "| dg /tmp/cache-dg " in served and "| warmup relax" in served
    assert "cache-stock/tilelang" in stock and "cache-ours/tilelang" in ep
    assert sorted(p.name for p in flash.glob("*.json")) == [
        "ours-ep-r1.json", "ours-tp2-r1.json", "stock-tp2-r1.json", "stock-tp2-r2.json"]
    assert "phase both done" in log and "all done" in log
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(flash / "runs") not in ps


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_seq_runs_ours_stock_then_ours_ep_in_turn_on_one_gpu_pair(pairs):
    """Phase seq (a two-GPU host): one server at a time on GPUs 0,1; every cache its own server's unless
    SEQ_SHARED_CACHES=1 (then TileLang's and DeepGEMM's shared); ours-EP only while PHASE_S is left."""
    r, flash, device_out = pairs("seq")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert list(device_out.iterdir()) == []
    events = [(line.split("] ", 1)[1] if "] " in line else line).split(" (pid")[0] for line in log.splitlines()
              if "] measure " in line or ": started (pid" in line]
    assert events == [
        "ours-tp2: started", "measure ours-tp2", "stock-tp2: started", "measure stock-tp2",
        "ours-ep: started", "measure ours-ep"], events
    served = {t: (flash / f"{t}.serve.log").read_text() for t in ("ours-tp2", "stock-tp2", "ours-ep")}
    for tag, text in served.items():
        cache = "/tmp/cache-stock" if tag.startswith("stock") else "/tmp/cache-ours"
        assert "| GPUs 0,1 " in text and f"| tilelang {cache}/tilelang " in text and f"| dg {cache}/dg " in text
    assert "backend.moe=marlin" in served["stock-tp2"] and "engine.ep=true" in served["ours-ep"]
    assert sorted(p.name for p in flash.glob("*.json")) == ["ours-ep-r1.json", "ours-tp2-r1.json", "stock-tp2-r1.json"]
    assert "phase seq done" in log

    r, flash, _ = pairs("seq_shared")
    for tag in ("ours-tp2", "stock-tp2", "ours-ep"):
        text = (flash / f"{tag}.serve.log").read_text()
        assert "| tilelang /tmp/cache-tl " in text and "| dg /tmp/cache-dg " in text

    r, flash, _ = pairs("seq_late")
    log = (flash / "pairs.log").read_text()
    assert "skip seq" in log and not list(flash.glob("*.json"))   # the whole phase needs PHASE_S too


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_seqep_measures_ours_ep_then_stock_ep_twice_each_and_compares_them(pairs):
    """Phase seqep (a two-GPU host): ours with EP, then stock with EP, one at a time on GPUs 0,1, two client
    runs each (a second only while MEASURE_S is left), then ours against stock round by round."""
    r, flash, device_out = pairs("seqep")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert list(device_out.iterdir()) == []
    events = [(line.split("] ", 1)[1] if "] " in line else line).split(" (pid")[0] for line in log.splitlines()
              if "] measure " in line or ": started (pid" in line]
    assert events == ["ours-ep: started", "measure ours-ep round 1", "measure ours-ep round 2",
                      "stock-ep: started", "measure stock-ep round 1", "measure stock-ep round 2"], events
    ours, stock = ((flash / f"{t}.serve.log").read_text() for t in ("ours-ep", "stock-ep"))
    for text in (ours, stock):
        assert "engine.ep=true" in text and "engine.tp=2" in text and "| GPUs 0,1 " in text
        assert "| tilelang /tmp/cache-tl " in text and "| dg /tmp/cache-dg " in text
    assert "backend.moe=triton_w4a16" in ours and "backend.moe=marlin" in stock
    assert "engine.port=8013" in ours and "engine.port=8014" in stock
    assert "ours/stock, ep, round 1" in log and "ours/stock, ep, round 2" in log
    assert sorted(p.name for p in flash.glob("*.json")) == [
        "ours-ep-r1.json", "ours-ep-r2.json", "stock-ep-r1.json", "stock-ep-r2.json"]
    assert "phase seqep done" in log and "all done" in log

    assert "] profile " not in log   # only with PROFILE=1

    r, flash, _ = pairs("seqep_profile")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    events = _client_steps(log)
    assert events == ["measure ours-ep round 1", "measure ours-ep round 2", "profile ours-ep",
                      "measure stock-ep round 1", "measure stock-ep round 2", "profile stock-ep"], events
    for tag in ("ours-ep", "stock-ep"):
        served = (flash / f"{tag}.serve.log").read_text()
        assert f"--profiler-config.torch_profiler_dir={flash}/prof/{tag}" in served
        assert f"== {tag} profiler_out_0.txt" in log
    assert "profiled one 2048 token prefill at http://127.0.0.1:8013/v1" in log and "l1_swiglu_wgmma_kernel" in log

    r, flash, _ = pairs("seqep_late")
    log = (flash / "pairs.log").read_text()
    assert "skip ours-ep round 2" in log and "skip stock-ep round 2" in log
    assert sorted(p.name for p in flash.glob("*.json")) == ["ours-ep-r1.json", "stock-ep-r1.json"]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(flash / "runs") not in ps


def _client_steps(log: str) -> list[str]:
    """pairs.log's measure and profile lines, in order, without their timestamps."""
    return [line.split("] ", 1)[1] for line in log.splitlines() if "] measure " in line or "] profile " in line]


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_a_pair_with_profile_profiles_each_server_after_the_rounds(pairs):
    """PROFILE=1 in a side-by-side phase: both servers start with vLLM's profiler; after the four client runs
    each one profiles a prefill in turn (never both at once), and its rank tables land in pairs.log."""
    r, flash, _ = pairs("pair_profile")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    events = _client_steps(log)
    assert events == ["measure ours-ep round 1", "measure stock-ep round 1", "measure stock-ep round 2",
                      "measure ours-ep round 2", "profile ours-ep", "profile stock-ep"], events
    assert "== ours-ep profiler_out_0.txt" in log and "== stock-ep profiler_out_0.txt" in log
    assert f"--profiler-config.torch_profiler_dir={flash}/prof/stock-ep" in (flash / "stock-ep.serve.log").read_text()


def test_the_profile_override_reaches_engine_extra_args_through_hydra():
    """dsv4_flash_serve.sh's PROFILE_DIR override, as the script writes it, composes into the engine's extra
    arguments (the stand-in server above only sees the raw string)."""
    import re

    from nvfp4stack.cli import compose_config

    script = (ROOT / "bench" / "dsv4_flash_serve.sh").read_text()
    override = re.search(r'prof=\("(engine\.extra_args=\[.*?\])"\)', script).group(1)
    cfg = compose_config("recipe=dsv4_flash_h200", "run_dir=/tmp/unused",
                         override.replace("$PROFILE_DIR", "/tmp/flash/prof/ours-ep"))
    assert list(cfg.engine.extra_args) == ["--profiler-config.profiler=torch",
                                           "--profiler-config.torch_profiler_dir=/tmp/flash/prof/ours-ep",
                                           "--profiler-config.torch_profiler_with_stack=false"]


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_tp4_with_the_draft_times_every_batch_and_scores_no_prompt(pairs):
    """TP4 + EP + MTP on four GPUs: two client runs at batches 1/32/256; neither asks for prompt_logprobs, which
    vLLM 0.26 gets wrong with the draft under CUDA graphs (vllm-project/vllm#53488, seen there on 2026-11-28)."""
    r, flash, device_out = pairs("tp4")
    log = (flash / "pairs.log").read_text()
    assert r.returncode == 0, r.stderr + log
    assert list(device_out.iterdir()) == []
    serve = (flash / "ours-tp4.serve.log").read_text()
    assert "engine.tp=4" in serve and "engine.ep=true" in serve and "| GPUs 0,1,2,3 " in serve
    assert "recipe=dsv4_flash_h200" in serve and "engine.speculative.method=null" not in serve   # the draft kept
    said = _scoring_skipped(flash)
    assert len(said) == 2 and all(line.startswith("teacher-forced scoring skipped: MTP draft with CUDA graphs")
                                  and "vllm-project/vllm#53488" in line for line in said), serve + log
    assert sorted(p.name for p in flash.glob("*.json")) == ["ours-tp4-r1.json", "ours-tp4-r2.json"]
    assert "phase tp4 done" in log
