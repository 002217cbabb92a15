"""Programmatic dependent launch between the mma.sync decode kernels (fused_moe.PDL): L2 launched in L1's tail
(its first weights loaded before it waits for h), the top-k sum in L2's.

GPU (sm90): the same bits as plain launches at 1-16 tokens on every mma.sync pair the tile choice can take,
split-K or not, under EP (-1 ids), eager and in a captured CUDA graph replayed with new inputs and routing (the
graph keeps the programmatic edges); each also against the fp32 twin. CPU: nothing here runs (the kernels are
Gluon, sm90 only); the flag's plumbing is on the GPU path alone.
"""
import os

import pytest
import torch

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with Triton")
LIMIT = 10.0
H, I = 2048, 1024


def _sm90():
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import decode_available

    if not decode_available(torch.device("cuda")):
        pytest.skip("programmatic dependent launch is used between the mma.sync decode kernels: sm90 only")


def _gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator(device="cuda").manual_seed(seed)


def _experts(g, experts):
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    w13 = torch.randn(experts, 2 * I, H, device="cuda", generator=g)
    w13 *= torch.rand(experts, 2 * I, 1, device="cuda", generator=g) * 3 / H**0.5  # rows of other scales
    w2 = torch.randn(experts, H, I, device="cuda", generator=g) / I**0.5
    return quantize_nvfp4(w13, name="w13"), quantize_nvfp4(w2, name="w2")


def _tokens(g, tokens, experts, top_k=6, other=0.0):
    x = (torch.randn(tokens, H, device="cuda", generator=g) * 4).bfloat16()
    ids = torch.stack([torch.randperm(experts, device="cuda", generator=g)[:top_k] for _ in range(tokens)])
    ids = torch.where(torch.rand(ids.shape, device="cuda", generator=g) < other, -1, ids).to(torch.int32)
    wts = torch.softmax(torch.randn(tokens, top_k, device="cuda", generator=g), -1)
    return x, ids, wts


def _pairs():
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T8, _DECODE_T16
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig as D

    out = []
    for (l1, l2), splits in ((_DECODE_FEW, ((1, 1), (2, 2), (4, 1))), (_DECODE_T8, ((1, 1), (2, 2))),
                             (_DECODE_T16, ((1, 2),))):
        for s1, s2 in splits:
            out.append((D(l1.block_t, l1.mrep, l1.block_k, l1.num_warps, l1.prefetch, split_k=s1),
                        D(l2.block_t, l2.mrep, l2.block_k, l2.num_warps, l2.prefetch, split_k=s2)))
    return out


def _both(monkeypatch, call):
    """(PDL, plain launches) outputs of ``call``."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

    assert fm.PDL
    on = call()
    monkeypatch.setattr(fm, "PDL", False)
    off = call()
    monkeypatch.setattr(fm, "PDL", True)
    torch.cuda.synchronize()
    return on, off


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_same_bits_as_plain_launches(tokens, monkeypatch):
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    _sm90()
    g = _gen()
    w13, w2 = _experts(g, 32)
    k13, k2 = tiles.tile_experts(w13, w2)
    for pair in _pairs():
        for other, routed in ((0.0, 0), (0.5, 64)):
            x, ids, wts = _tokens(g, tokens, 32, other=other)
            on, off = _both(monkeypatch, lambda: nvfp4_moe_forward_triton(
                x, k13, k2, wts, ids, swiglu_limit=LIMIT, config=pair, poison=True, tiled=True,
                routed_experts=routed))
            assert on.shape == (tokens, H) and torch.equal(on, off), f"PDL differs: {pair}, ids {ids.tolist()}"
            zeroed = torch.where(ids < 0, torch.zeros_like(wts), wts)
            ref = nvfp4_moe_forward(x.float(), w13, w2, zeroed, ids.clamp(min=0), swiglu_limit=LIMIT)
            err = ((on.float() - ref.float()).norm() / ref.float().norm()).item()
            print(f"{tokens} tokens, {pair}, EP share {other}: rel err {err:.2e}")
            assert bool(torch.isfinite(on).all()) and err <= 1e-2


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4])
def test_pdl_in_a_cuda_graph(tokens, monkeypatch):
    """Captured with PDL (as vLLM's decode graphs): replays with new activations and routing equal the eager
    plain launches bit for bit."""
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton

    _sm90()
    g = _gen()
    w13, w2 = _experts(g, 64)
    x, ids, wts = _tokens(g, tokens, 64)
    pair = _pairs()[1]  # split 2 / 2: L1's counters and L2's partials under PDL
    run = lambda: nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=pair)  # noqa: E731
    _both(monkeypatch, run)  # both variants compiled, the counters made, outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for other in (0.0, 0.5, 0.0):
        nx, nids, nwts = _tokens(g, tokens, 64, other=other)
        x.copy_(nx)
        ids.copy_(nids)
        wts.copy_(nwts)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _both(monkeypatch, run)[1]), "a PDL graph's replay differs from plain launches"
