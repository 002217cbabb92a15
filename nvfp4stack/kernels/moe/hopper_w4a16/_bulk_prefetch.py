"""L2-cache prefetch by the TMA unit (``cp.async.bulk.prefetch.L2``, sm90) for the Gluon decode kernels
(_decode_gluon.py, ``DecodeConfig.bulk``).

At a few tokens the decode kernels wait on memory with few warps: each warp has one or two K steps of
weight bytes in flight (bench/moe_kernel_notes.md, "Decode, sixteenth pass"). A bulk prefetch asks the
memory system for a CTA's whole weight slice at the CTA's start, in one instruction a thread, without
registers or shared memory; the K loop then reads the bytes from L2 as they arrive. Bit 1 of ``bulk``:
each CTA its own weights and scales (L2's CTAs do it before they wait for L1's h, so their bytes come
during L1's tail); bit 2: L1's CTAs also the second GEMM's weights and scales of their expert, each a
share; bit 4: those with the L2 evict-last policy (they must survive L1's own stream).

A prefetch is a hint: it changes no value the kernels compute, only when bytes arrive.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# one bulk prefetch per element (address, bytes), issued by the threads below the element count only: a
# 1-D tensor smaller than the CTA is replicated over the other threads, which must not issue it again
_PTX = gl.constexpr("""{
.reg .pred p, q;
.reg .b32 t;
mov.u32 t, %tid.x;
setp.lt.u32 p, t, $3;
setp.gt.s32 q, $2, 0;
and.pred p, p, q;
@p cp.async.bulk.prefetch.L2.global [$1], $2;
mov.u32 $0, 0;
}""")
_PTX_LAST = gl.constexpr("""{
.reg .pred p, q;
.reg .b32 t;
.reg .b64 pol;
mov.u32 t, %tid.x;
setp.lt.u32 p, t, $3;
setp.gt.s32 q, $2, 0;
and.pred p, p, q;
createpolicy.fractional.L2::evict_last.b64 pol, 1.0;
@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol;
mov.u32 $0, 0;
}""")


@gluon.jit
def _issue(addr, nbytes, N: gl.constexpr, L: gl.constexpr, LAST: gl.constexpr):
    """Prefetch ``nbytes[i]`` bytes (a multiple of 16; 0: none) at ``addr[i]`` (int64, 16-byte aligned) for each
    of the N elements of two 1-D tensors in layout L (one element a thread, replicated past N threads)."""
    count = gl.full([N], N, gl.int32, layout=L)
    gl.inline_asm_elementwise(asm=_PTX_LAST if LAST else _PTX, constraints="=r,l,r,r", args=[addr, nbytes, count],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def row_bases(w_row, s_row, ROWS: gl.constexpr):
    """(weight, scale) first-byte addresses of a tile's ROWS rows (``w_row`` / ``s_row`` as _gemm_rows takes them)
    as int64 in the one-row-a-thread layout ``rows`` wants, made once outside a K loop."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    return gl.convert_layout(w_row, L).to(gl.int64), gl.convert_layout(s_row, L).to(gl.int64)


@gluon.jit
def rows(w, s, k_lo, k_hi, ROWS: gl.constexpr, TILED: gl.constexpr):
    """Prefetch the weight and scale bytes of K columns [k_lo, k_hi) of the rows at ``w`` / ``s`` (``row_bases``).
    Tiled weights (tiles.py; ROWS a multiple of 64): each 64-row block's atoms of the run are one contiguous
    stretch, prefetched in 64 equal pieces, one a row; row-major weights and the scales: each row's bytes,
    widened to whole 16-byte pieces."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    r = gl.arange(0, ROWS, layout=L)
    if TILED:  # atoms of 128 codes (64 bytes a row, 4 KB a 64-row block) from k_lo's to k_hi's
        a_lo = k_lo // 128
        piece = ((k_hi + 127) // 128 - a_lo) * 64
        w_lo = w - (r % 64) * 64 + a_lo * 4096 + (r % 64) * piece
        w_n = gl.full([ROWS], 0, gl.int32, layout=L) + piece
    else:
        w_lo = (w + k_lo // 2) // 16 * 16
        w_n = (((w + k_hi // 2 + 15) // 16 * 16) - w_lo).to(gl.int32)
    _issue(w_lo, w_n, ROWS, L, False)
    s_lo = (s + k_lo // 16) // 16 * 16
    _issue(s_lo, (((s + k_hi // 16 + 15) // 16 * 16) - s_lo).to(gl.int32), ROWS, L, False)


@gluon.jit
def step_ahead(w, s, k0, k_lo, k_hi, BK: gl.constexpr, AHEAD: gl.constexpr, ROWS: gl.constexpr, TILED: gl.constexpr):
    """In a K loop over [k_lo, k_hi) that loads step ``k0``: prefetch step k0 + AHEAD (none at k0 = k_lo, whose
    window of steps 1 .. AHEAD the caller asked for before the loop; none past k_hi)."""
    lo = gl.minimum(gl.maximum(k0 + AHEAD * BK, k_lo + (AHEAD + 1) * BK), k_hi)
    rows(w, s, lo, gl.minimum(k0 + (AHEAD + 1) * BK, k_hi), ROWS, TILED)


@gluon.jit
def own_rows(w_row, s_row, k_lo, k_hi, ROWS: gl.constexpr, TILED: gl.constexpr):
    """Bit 1: prefetch this CTA's weight and scale bytes of K columns [k_lo, k_hi) (``rows``)."""
    w, s = row_bases(w_row, s_row, ROWS)
    rows(w, s, k_lo, k_hi, ROWS, TILED)


@gluon.jit
def expert_share(base, nbytes, share, ROWS: gl.constexpr, LAST: gl.constexpr):
    """Bits 2 and 4: prefetch share ``share`` (of ``num_programs(0) * num_programs(2)``, the CTAs of one
    routing block) of the ``nbytes`` bytes at ``base`` (one expert's contiguous tensor, 16-byte aligned), in
    ROWS pieces, one a thread."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    parts = gl.num_programs(0) * gl.num_programs(2) * ROWS
    piece = ((nbytes + parts - 1) // parts + 15) // 16 * 16
    i = share * ROWS + gl.arange(0, ROWS, layout=L)
    lo = i.to(gl.int64) * piece
    n = gl.minimum(gl.maximum(nbytes - lo, 0), piece).to(gl.int32)
    _issue(base.to(gl.int64) + lo, n, ROWS, L, LAST)
