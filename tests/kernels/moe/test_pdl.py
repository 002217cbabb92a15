"""Programmatic dependent launch between the mma.sync decode kernels (fused_moe.PDL): L2 launched in L1's tail
(its first weights loaded before it waits for h), the top-k sum in L2's.

GPU (sm90): the same bits as plain launches at 1-16 tokens on every mma.sync pair the tile choice can take,
split-K or not, under EP (-1 ids), eager and in a captured CUDA graph replayed with new inputs and routing (the
graph keeps the programmatic edges); each also against the fp32 twin; and the decode launch is asked for PDL
exactly when the switch is on. CPU: which tiles take it (the mma.sync pairs; not the wgmma ring, not the Triton
tiles, not with the switch off).
"""
import pytest
import torch

from tests.support.decode_moe import (
    fresh_generator,
    nvfp4_experts,
    on_and_off,
    routed_tokens,
    sm90_or_skip,
    with_splits,
)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with Triton")
LIMIT = 10.0
H, I = 2048, 1024


def _pairs():
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T8, _DECODE_T16

    return [with_splits(pair, s1, s2) for pair, splits in ((_DECODE_FEW, ((1, 1), (2, 2), (4, 1))),
                                                           (_DECODE_T8, ((1, 1), (2, 2))), (_DECODE_T16, ((1, 2),)))
            for s1, s2 in splits]


def test_pdl_goes_with_the_mma_sync_pairs_only(monkeypatch):
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW, _DECODE_T16_RING, CANDIDATES

    assert fm.PDL is True
    assert all(fm.pdl_path(p[0]) for p in _pairs())
    assert not fm.pdl_path(_DECODE_T16_RING[0]) and not fm.pdl_path(CANDIDATES[0][0])
    monkeypatch.setattr(fm, "PDL", False)
    assert not fm.pdl_path(_DECODE_FEW[0])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_same_bits_as_plain_launches(tokens, monkeypatch):
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    sm90_or_skip("programmatic dependent launch is used between the mma.sync decode kernels")
    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg  # Gluon: importable where the kernels run

    g = fresh_generator()
    w13, w2 = nvfp4_experts(g, 32, H, I)
    k13, k2 = tiles.tile_experts(w13, w2)
    asked, launch = [], dg.launch
    monkeypatch.setattr(dg, "launch", lambda *a, **k: (asked.append(k["pdl"]), launch(*a, **k))[1])
    for pair in _pairs():
        for other, routed in ((0.0, 0), (0.5, 64)):
            x, ids, wts = routed_tokens(g, tokens, 32, H, other=other)
            on, off = on_and_off(monkeypatch, "PDL", lambda: nvfp4_moe_forward_triton(
                x, k13, k2, wts, ids, swiglu_limit=LIMIT, config=pair, poison=True, tiled=True,
                routed_experts=routed))
            assert asked[-2:] == [True, False]   # the switch reached the launch
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

    sm90_or_skip("programmatic dependent launch is used between the mma.sync decode kernels")
    g = fresh_generator()
    w13, w2 = nvfp4_experts(g, 64, H, I)
    x, ids, wts = routed_tokens(g, tokens, 64, H)
    pair = _pairs()[1]  # split 2 / 2: L1's counters and L2's partials under PDL
    run = lambda: nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=pair)  # noqa: E731
    on_and_off(monkeypatch, "PDL", run)  # both variants compiled, the counters made, outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for other in (0.0, 0.5, 0.0):
        nx, nids, nwts = routed_tokens(g, tokens, 64, H, other=other)
        x.copy_(nx)
        ids.copy_(nids)
        wts.copy_(nwts)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, on_and_off(monkeypatch, "PDL", run)[1]), "a PDL graph's replay differs from plain launches"
