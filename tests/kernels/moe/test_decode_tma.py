"""The mma.sync decode pair with its weights brought by TMA into a shared-memory ring (DecodeConfig.tma,
_decode_tma.py).

CPU: the config checks, and the ring's addressing against tiles.py: the lines a tile's TMA boxes copy, read back
through the slot's register layout (line_layout) and reshaped, are tiles.py's words of rows r and columns c exactly
where the register-load kernels' word layout (w32) puts word (r, c), for L1 (tiled rows) and L2, at 64 and 128 rows.
GPU (sm90): the same bits as the register-load pair of the same block_t, block_k and split_k, at 1-16 tokens,
under EP (-1 ids), with and without PDL, eager and in a CUDA graph replayed with new inputs; each against the fp32
twin.
"""
from dataclasses import replace

import pytest
import torch

from tests.support.decode_moe import fresh_generator, nvfp4_experts, on_and_off, routed_tokens, sm90_or_skip

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with Triton")
LIMIT = 10.0
H, I = 2048, 1024


def test_tma_config_is_checked():
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig

    assert DecodeConfig(8, 1, 256, 8, 0, split_k=2, tma=4).fits(4096, 2048)
    assert DecodeConfig(8, 2, 128, 4, 0, tma=8).rows == 128
    for bad in (dict(tma=5), dict(tma=4, prefetch=1), dict(tma=4, num_warps=2),  # 32 rows: half a row block
                dict(tma=4, block_k=64), dict(tma=4, wgmma=3, prefetch=3, block_t=16)):
        with pytest.raises(ValueError, match="tma"):
            DecodeConfig(**{**dict(block_t=8, mrep=1, block_k=256, num_warps=4), **bad})


def _apply(bases: dict, reg: int, lane: int, warp: int) -> tuple:
    """Coordinates a linear layout gives register ``reg`` of lane ``lane`` of warp ``warp`` (XOR of bases)."""
    out = None
    for kind, index in (("reg_bases", reg), ("lane_bases", lane), ("warp_bases", warp)):
        for bit, basis in enumerate(bases[kind]):
            if index >> bit & 1:
                out = list(basis) if out is None else [a ^ b for a, b in zip(out, basis)]
    return tuple(out or [0] * len(bases["lane_bases"][0]))


@pytest.mark.parametrize("gemm,num_warps,mrep,block_k", [("l1", 8, 1, 256), ("l1", 4, 1, 256), ("l2", 4, 2, 128),
                                                         ("l2", 4, 1, 128)])
def test_ring_slot_holds_the_register_layouts_bytes(gemm, num_warps, mrep, block_k):
    pytest.importorskip("triton.experimental.gluon", reason="Gluon layouts (Triton >= 3.6)")
    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_layouts as dl
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles

    rows, experts, n, k = 16 * num_warps * mrep, 2, 512, 1024
    g = torch.Generator().manual_seed(7)
    stored = tiles.to_tiles(torch.randint(0, 256, (experts, n, k // 2), generator=g, dtype=torch.uint8), gemm == "l1")
    expert, tile, k_lo = 1, 1, 2 * block_k  # the second expert, the second tile, the third K step
    first_row = tile * rows  # stored row of the tile's row 0 (L1: 2 * n0, tiles.l1_row's order)
    # the kernels' TMA addressing (_decode_tma: _line, rb_lines = K/2, box = block_k/2 lines)
    line0 = (expert * stored.stride(0) + first_row // 64 * 32 * k + k_lo // 128 * 4096) // 64
    words, box = stored.reshape(-1).view(torch.int32).reshape(-1, 16), block_k // 2  # a line: 64 bytes, 16 words
    slot = torch.cat([words[line0 + rb * (k // 2): line0 + rb * (k // 2) + box] for rb in range(rows // 64)])
    w32 = dl._w_bases(num_warps, mrep, block_k, 4)
    ring = dl.line_layout(num_warps, mrep, block_k)
    ring_bases = dict(reg_bases=ring.reg_bases, lane_bases=ring.lane_bases, warp_bases=ring.warp_bases)
    flat = stored[expert].reshape(-1).view(torch.int32)
    seen = set()
    for warp in range(num_warps):
        for lane in range(32):
            for reg in range(1 << len(w32["reg_bases"])):
                r, c = _apply(w32, reg, lane, warp)  # row, word of the tile
                line, o = _apply(ring_bases, reg, lane, warp)
                off = tiles.byte_offset(torch.tensor(first_row + r), torch.tensor(k_lo // 2 + 4 * c), k)
                assert slot[line, o] == flat[off // 4], (warp, lane, reg, r, c, line, o)
                seen.add((r, c))
    assert len(seen) == rows * block_k // 8  # every word of the tile, once


def _pairs():
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig

    few1, few2 = DecodeConfig(8, 1, 256, 8, 0), DecodeConfig(8, 2, 128, 4, 0)
    out = []
    for s1, s2 in ((2, 2), (1, 1), (4, 2)):
        for l1w, l2m, stages in ((8, 2, 4), (4, 1, 2), (8, 2, 8)):
            tma = (replace(few1, num_warps=l1w, split_k=s1, tma=stages), replace(few2, mrep=l2m, split_k=s2, tma=stages))
            out.append(((replace(few1, split_k=s1), replace(few2, split_k=s2)), tma))
    return out


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_same_bits_as_the_register_loads(tokens, monkeypatch):
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    sm90_or_skip("the TMA decode ring is an sm90 kernel")
    from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_tma as dt  # Gluon: importable where the kernels run

    g = fresh_generator()
    w13, w2 = nvfp4_experts(g, 32, H, I)
    k13, k2 = tiles.tile_experts(w13, w2)
    for plain, tma in _pairs():
        for other, routed in ((0.0, 0), (0.5, 64)):
            x, ids, wts = routed_tokens(g, tokens, 32, H, other=other)
            run = lambda pair: nvfp4_moe_forward_triton(  # noqa: E731
                x, k13, k2, wts, ids, swiglu_limit=LIMIT, config=pair, poison=True, tiled=True, routed_experts=routed)
            want = run(plain)
            for line_bytes in (256, 64):  # the TMA view's line: 4 atom rows unswizzled, or 1 with 64-byte swizzle
                monkeypatch.setattr(dt, "LINE_BYTES", line_bytes)
                on, off = on_and_off(monkeypatch, "PDL", lambda: run(tma))
                assert torch.equal(on, want) and torch.equal(off, want), f"TMA {tma} ({line_bytes}) differs: {plain}"
            zeroed = torch.where(ids < 0, torch.zeros_like(wts), wts)
            ref = nvfp4_moe_forward(x.float(), w13, w2, zeroed, ids.clamp(min=0), swiglu_limit=LIMIT)
            err = ((on.float() - ref.float()).norm() / ref.float().norm()).item()
            print(f"{tokens} tokens, {tma}, EP share {other}: rel err {err:.2e}")
            assert bool(torch.isfinite(on).all()) and err <= 1e-2


@gpu
@pytest.mark.gpu
def test_tma_ring_in_a_cuda_graph():
    """Captured (as vLLM's decode graphs; the descriptors are kernel parameters): replays with new activations and
    routing equal eager calls bit for bit."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton

    sm90_or_skip("the TMA decode ring is an sm90 kernel")
    g = fresh_generator()
    w13, w2 = nvfp4_experts(g, 64, H, I)
    k13, k2 = tiles.tile_experts(w13, w2)
    x, ids, wts = routed_tokens(g, 1, 64, H)
    pair = _pairs()[0][1]
    run = lambda: nvfp4_moe_forward_triton(x, k13, k2, wts, ids, swiglu_limit=LIMIT, config=pair,  # noqa: E731
                                           tiled=True)
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for other in (0.0, 0.5, 0.0):
        nx, nids, nwts = routed_tokens(g, 1, 64, H, other=other)
        x.copy_(nx)
        ids.copy_(nids)
        wts.copy_(nwts)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run()), "a TMA graph's replay differs from an eager call"
