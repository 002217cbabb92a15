"""Register layouts (Gluon) of the mma.sync decode kernels (_decode_gluon.py; the wgmma kernels reuse the weight
ones): which thread holds which weight byte, scale block and activation, so that both mma.sync operands are built
in registers in the exact fragment layouts."""
from __future__ import annotations

from triton.experimental.gluon import language as gl


def _bits(n: int) -> list[int]:
    out, b = [], 1
    while b < n:
        out.append(b)
        b *= 2
    return out


def _w_bases(num_warps: int, mrep: int, block_k: int, unit: int = 1) -> dict:
    """Bases of the weight tile's layout [rows, block_k/2/unit] in units of ``unit`` bytes (1: bytes, 4: int32 words):
    each thread block_k/8 consecutive bytes of rows r and r + 8 (a lane quad spans the K step, 8 quads 8 rows),
    16-row tiles over warps, then over mrep."""
    per = block_k // 8 // unit
    return dict(reg_bases=[[0, b] for b in _bits(per)] + [[8, 0]] + [[16 * num_warps * m, 0] for m in _bits(mrep)],
                lane_bases=[[0, per], [0, 2 * per], [1, 0], [2, 0], [4, 0]],
                warp_bases=[[16 * w, 0] for w in _bits(num_warps)])


def decode_layouts(num_warps: int, mrep: int, block_t: int, block_k: int, prefetch: int = 0):
    """Register layouts (Gluon) for one CTA of ``num_warps`` warps, each warp ``mrep`` 16-row tiles.

    Returns (mma, w_bytes [R, BK/2], w_blocks [R, BK/16, 8], x [BT, BK], extra) where extra is
    (w32,): the weight tile as int32 words for the register-prefetch variants (prefetch 1 and 2), else None.
    """
    assert block_k % 64 == 0 and block_t in (8, 16, 32)
    rows = 16 * num_warps * mrep
    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    rep_rows = [[16 * num_warps * m, 0] for m in _bits(mrep)]
    warps2 = [[16 * w, 0] for w in _bits(num_warps)]
    w_bytes = gl.DistributedLinearLayout(**_w_bases(num_warps, mrep, block_k), block_bases=[], shape=[rows, block_k // 2])
    nbt = block_k // 64  # scale blocks per thread per row
    w_blocks = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4]] + [[0, b, 0] for b in _bits(nbt)] + [[8, 0, 0]]
        + [[r[0], 0, 0] for r in rep_rows],
        lane_bases=[[0, nbt, 0], [0, 2 * nbt, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[w[0], 0, 0] for w in warps2], block_bases=[], shape=[rows, block_k // 16, 8],
    )
    x = gl.DistributedLinearLayout(
        reg_bases=[[0, b] for b in _bits(block_k // 4)] + [[8 * b, 0] for b in _bits(block_t // 8)],
        lane_bases=[[0, block_k // 4], [0, block_k // 2], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[0, 0] for _ in _bits(num_warps)], block_bases=[], shape=[block_t, block_k],
    )
    # the weight tile as 32-bit words (register-prefetch variants, prefetch 1 and 2)
    w32 = gl.DistributedLinearLayout(**_w_bases(num_warps, mrep, block_k, 4), block_bases=[], shape=[rows, block_k // 8])
    extra = (w32,) if prefetch in (1, 2) else None
    return mma, w_bytes, w_blocks, x, extra
