"""nvfp4stack/models/deepseek_v4/mhc_gemms.py: the mHC warm-up's DeepGEMM GEMMs recorded during the TileLang rounds,
made in child processes, then run once more with vLLM's own GEMM.

On the CPU: the recorder (layouts, de-duplicated, always restored), a child's calls, the children's specs, and the
warm-up's order with stand-in kernels that import the GEMM the way vLLM 0.26's mHC functions do. On a GPU with vLLM
0.26 (cold DeepGEMM cache): the children compile the GEMM kernels and the warm-up's own pass compiles nothing."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nvfp4stack.engine import deepgemm_warmup as dw
from nvfp4stack.models.deepseek_v4 import mhc_gemms, mhc_warmup
from tests.models.test_dsv4_mhc_warmup import DeepseekV4DecoderLayer, _FlashLayer
from tests.support.deepgemm import cold_cache, kernel_dirs


def _gemm_module(seen: list):
    def tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_split):
        seen.append((tuple(x.shape), num_split))
        out.zero_()
        sqrsum.zero_()
        return out

    return SimpleNamespace(tf32_hc_prenorm_gemm=tf32_hc_prenorm_gemm)


def test_the_recorder_keeps_each_layout_once_and_is_always_restored():
    seen, calls = [], {}
    mod = _gemm_module(seen)
    real = mod.tf32_hc_prenorm_gemm
    x = torch.randn(64, 32)[:, :16]   # a strided view: the layout, strides included, is what a child rebuilds
    fn, out, sq = torch.randn(24, 16), torch.empty(2, 64, 24), torch.empty(2, 64)
    with mhc_gemms.recorded(calls, mod):
        for _ in range(3):
            mod.tf32_hc_prenorm_gemm(x, fn, out, sq, 2)
        mod.tf32_hc_prenorm_gemm(x[:8], fn, out[:, :8], sq[:, :8], 1)
    assert seen == [] and mod.tf32_hc_prenorm_gemm is real
    assert [(c["x"]["shape"], c["x"]["stride"], c["num_split"]) for c in calls.values()] == [
        ([64, 16], [32, 1], 2), ([8, 16], [32, 1], 1)]
    with pytest.raises(RuntimeError), mhc_gemms.recorded({}, mod):
        raise RuntimeError("a warm-up step failed")
    assert mod.tf32_hc_prenorm_gemm is real


def test_a_child_makes_each_recorded_call_on_tensors_of_its_layout():
    calls, got = {}, []
    mod = _gemm_module([])
    with mhc_gemms.recorded(calls, mod):
        mod.tf32_hc_prenorm_gemm(torch.randn(64, 32)[:, :16], torch.randn(24, 16), torch.empty(3, 64, 24),
                                 torch.empty(3, 64), 3)

    def gemm(x, fn, out, sqrsum, num_split):
        got.append((x.shape, x.stride(), x.dtype, fn.shape, out.shape, sqrsum.shape, num_split))

    mhc_gemms.run(list(calls.values()), "cpu", gemm=gemm)
    assert got == [((64, 16), (32, 1), torch.float32, (24, 16), (3, 64, 24), (3, 64), 3)]


def _item(k: int, split: int, rows: int = 64) -> dict:
    return {"x": {"shape": [rows, k], "stride": [k, 1], "dtype": "bfloat16"},
            "fn": {"shape": [24, k], "stride": [k, 1], "dtype": "float32"}, "num_split": split}


def test_one_call_per_kernel_is_dealt_to_the_children_on_this_gpu_where_they_pay(monkeypatch, tmp_path):
    ran = []
    # 13 layouts, 5 kernels: DeepGEMM specializes by (weight shape, split), not by the token count
    layouts = [_item(16384, s, rows) for s in (64, 44, 33) for rows in (1, 64, 128)] + [_item(4096, 16, r) for r in (1, 2)]
    layouts += [_item(4096, 8, 7), _item(4096, 8, 9)]
    calls = {str(i): it for i, it in enumerate(layouts)}
    runner = lambda specs, timeout: (ran.append((specs, timeout)), (len(specs), 0))[1]   # noqa: E731
    assert mhc_gemms.compile_in_children(calls, 3, procs=2, runner=runner, min_kernels=5, cache_dir="/nonexistent") == (2, 0)
    specs, timeout = ran[0]
    assert timeout == dw.child_timeout() and {s["device"] for s in specs} == {3}
    dealt = [[mhc_gemms.kernel_key(i) for i in s["work"][mhc_gemms.ENTRY]] for s in specs]
    assert sorted(k for part in dealt for k in part) == sorted({mhc_gemms.kernel_key(i) for i in layouts})
    assert [len(part) for part in dealt] == [3, 2] and all(s["cases"] == [] for s in specs)
    module, _, name = mhc_gemms.ENTRY.partition(":")   # what a child imports
    assert getattr(sys.modules[module], name) is mhc_gemms.run
    assert mhc_gemms.compile_in_children({}, 0, procs=4, runner=runner, min_kernels=0) == (0, 0)
    assert mhc_gemms.compile_in_children(calls, 0, procs=0, runner=runner, min_kernels=1) == (0, 0)   # turned off
    # too few kernels to pay for the children's start (the H200's 256 tokens: 4 kernels, slower with children)
    assert mhc_gemms.compile_in_children(calls, 0, procs=2, runner=runner, min_kernels=6, cache_dir="/nonexistent") == (0, 0)
    # a cache holding fewer of these kernels than needed (vLLM's profile run compiles a few first): children
    cache = tmp_path / "cache"
    for i in range(4):
        (cache / f"kernel.sm90_tf32_hc_prenorm_gemm.{i:04}").mkdir(parents=True)
    (cache / "kernel.sm90_fp8_gemm_1d2d.0000").mkdir()
    assert mhc_gemms.cached_kernels(str(tmp_path)) == 4   # this GEMM's only
    assert mhc_gemms.compile_in_children(calls, 0, procs=2, runner=runner, min_kernels=1, cache_dir=str(tmp_path)) == (2, 0)
    # as many as needed (a host that compiled them once): none
    (cache / "kernel.sm90_tf32_hc_prenorm_gemm.0004").mkdir()
    assert mhc_gemms.compile_in_children(calls, 0, procs=2, runner=runner, min_kernels=1, cache_dir=str(tmp_path)) == (0, 0)
    assert len(ran) == 2
    monkeypatch.setenv(dw.ENV_PROCS, "0")
    assert dw.child_procs() == 0
    monkeypatch.setenv(dw.ENV_PROCS, "3")
    assert dw.child_procs() == 3


def test_the_warmup_records_then_children_then_runs_every_step_with_the_real_gemm(monkeypatch):
    """Stand-in kernels import the GEMM at each call, as vLLM 0.26's mHC functions do: during the rounds it is the
    recorder, then the children get the layouts, then every step runs once more with the module's own GEMM."""
    pytest.importorskip("vllm.utils.deep_gemm")
    import vllm.utils.deep_gemm as vdg

    order = []
    monkeypatch.setattr(vdg, "tf32_hc_prenorm_gemm",
                        lambda x, fn, out, sq, k: order.append(("real", x.shape[0])), raising=False)
    real = vdg.tf32_hc_prenorm_gemm

    def pre_broadcast(x, fn, scale, base, *hc, norm_weight, norm_eps, fn_broadcast):
        from vllm.utils.deep_gemm import tf32_hc_prenorm_gemm  # looked up at the call, like vLLM's

        n = x.shape[0]
        tf32_hc_prenorm_gemm(x, fn_broadcast, torch.empty(1, n, 24), torch.empty(1, n), 1)
        return torch.ones(n, 4, 8), torch.ones(n, 4, 1), torch.ones(n, 4, 4), x

    def fused_post_pre(x, residual, *rest, **kw):
        return x

    def children(calls, device_index):
        order.append(("children", sorted(c["x"]["shape"][0] for c in calls.values())))
        return len(calls), 0

    monkeypatch.setattr(mhc_gemms, "compile_in_children", children)
    model = nn.ModuleList([DeepseekV4DecoderLayer()])
    sizes = mhc_warmup.token_counts(100)
    assert mhc_warmup.warm_every_split(model, 100, kernels=(pre_broadcast, fused_post_pre), gemms=True) == len(sizes)
    assert order == [("children", sizes)] + [("real", n) for n in sizes]
    assert vdg.tf32_hc_prenorm_gemm is real
    order.clear()   # the default with stand-in kernels (or on the CPU): no recorder, no children
    mhc_warmup.warm_every_split(model, 100, kernels=(pre_broadcast, fused_post_pre))
    assert order == [("real", n) for n in sizes]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: vLLM 0.26's DeepGEMM and mHC kernels")
def test_on_a_gpu_the_children_compile_the_gemms_and_the_warmups_own_pass_compiles_none(tmp_path, monkeypatch):
    cold_cache(tmp_path, monkeypatch)
    pytest.importorskip("vllm.model_executor.kernels.mhc.tilelang", reason="needs tilelang (DSV4 bundle)")
    after_children = []
    real = mhc_gemms.compile_in_children

    def children(calls, device_index):
        result = real(calls, device_index, procs=4, min_kernels=1)   # 256 tokens: 4 kernels, under MIN_KERNELS
        after_children.append((len(calls), result, kernel_dirs(tmp_path)))
        return result

    monkeypatch.setattr(mhc_gemms, "compile_in_children", children)
    model = nn.ModuleList([_FlashLayer()])
    assert mhc_warmup.warm_every_split(model, 256) == len(mhc_warmup.token_counts(256))
    (n_calls, (ok, failed), built), = after_children
    assert n_calls >= 2 and failed == 0 and ok >= 1
    assert any("hc_prenorm" in k for k in built), built
    assert kernel_dirs(tmp_path) == built   # the warm-up's own pass with vLLM's GEMM loaded them all
