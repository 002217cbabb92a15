"""The one-token path of the triton_w4a16 MoE (fused_moe.one_token_path): no routing launch, the top-k sum in L2.

GPU (sm90): the same bits as the general path (align_routing, then topk_sum_kernel) for every split-K pair,
with and without the clamp, under EP (-1 ids, a token with none of this rank's experts), tiled or not; in a
captured CUDA graph with new routing at each replay; the capture-time fallback. CPU: routing.one_token_routing
and the warm-up keys are tested in test_routing.py / test_warmup.py.
"""
import pytest
import torch

from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW
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
H, I = 2048, 1024  # L1: 8 K steps of 256, L2: 8 of 128 (split 1, 2, 4, 8 divide both)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("splits", [(1, 1), (2, 2), (4, 2), (2, 1), (1, 4), (4, 4)])
def test_same_bits_as_the_general_path(splits, tiled, monkeypatch):
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    sm90_or_skip("the one-token path runs the mma.sync decode kernels")
    g = fresh_generator()
    w13, w2 = nvfp4_experts(g, 32, H, I)
    k13, k2 = tiles.tile_experts(w13, w2) if tiled else (w13, w2)
    for other, limit, routed in ((0.0, LIMIT, 0), (0.0, None, 0), (0.5, LIMIT, 64), (1.0, LIMIT, 64)):
        x, ids, wts = routed_tokens(g, 1, 32, H, other=other)
        fast, slow = on_and_off(monkeypatch, "ONE_TOKEN", lambda: nvfp4_moe_forward_triton(
            x, k13, k2, wts, ids, swiglu_limit=limit, config=with_splits(_DECODE_FEW, *splits), poison=True, tiled=tiled,
            routed_experts=routed))
        assert fast.shape == (1, H) and fast.dtype == torch.bfloat16
        assert torch.equal(fast, slow), f"one-token path differs: ids {ids.tolist()}, limit {limit}"
        zeroed = torch.where(ids < 0, torch.zeros_like(wts), wts)
        ref = nvfp4_moe_forward(x.float(), w13, w2, zeroed, ids.clamp(min=0), swiglu_limit=limit)
        if bool((ids < 0).all()):
            assert int(fast.count_nonzero()) == 0  # no slot of this rank's: zeros, as topk_sum writes
        else:
            err = ((fast.float() - ref.float()).norm() / ref.float().norm()).item()
            print(f"splits {splits} tiled {tiled} ids {ids.tolist()} limit {limit}: rel err {err:.2e}")
            assert bool(torch.isfinite(fast).all()) and err <= 1e-2


@gpu
@pytest.mark.gpu
def test_one_token_in_cuda_graph_and_capture_fallback(monkeypatch):
    """Captured at one token (as vLLM's batch-1 decode graph): replays with new activations and routing (-1
    slots among them) equal the eager call bit for bit, every count is back to zero after; first asked for
    inside a capture, the constant routing tensors are not made there and the call takes align_routing."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import decode_buffers, routing_triton
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton

    sm90_or_skip("the one-token path runs the mma.sync decode kernels")
    g = fresh_generator()
    w13, w2 = nvfp4_experts(g, 64, H, I)
    x, ids, wts = routed_tokens(g, 1, 64, H)
    pair = with_splits(_DECODE_FEW, 2, 2)
    run = lambda: nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=pair)  # noqa: E731
    first = run()
    assert all(torch.equal(first, run()) for _ in range(3))
    assert torch.equal(first, on_and_off(monkeypatch, "ONE_TOKEN", run)[1])  # the fallback's kernels compiled outside capture
    graphs = {}
    for cached in (True, False):
        if not cached:
            monkeypatch.setattr(routing_triton, "_ONE_TOKEN", {})
        graphs[cached] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[cached]):
            out = run()
        assert bool(routing_triton._ONE_TOKEN) == cached  # nothing made inside the capture
        for other in (0.0, 0.5, 0.0):
            nx, nids, nwts = routed_tokens(g, 1, 64, H, other=other)
            x.copy_(nx)
            ids.copy_(nids)
            wts.copy_(nwts)
            graphs[cached].replay()
            torch.cuda.synchronize()
            assert torch.equal(out, run()), f"replay differs from eager (cached constants: {cached})"
    assert int(decode_buffers._COUNTS[str(x.device)].abs().sum()) == 0
