"""The token side and the epilogues of the Gluon decode kernels (_decode_gluon.py, _decode_wgmma.py):
routing-block slots, the clamped SwiGLU of L1, L2's routing-weighted rows, and the split-K sum of L1's runs.

Imported lazily, GPU hosts only (Triton >= 3.6 with ``triton.experimental.gluon``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# tiles carry value * scale * 2**-8 (as in _triton_kernels); the epilogue multiplies it back
_TILE_UNSCALE = gl.constexpr(256.0)
# the CTA barrier: gl.thread_barrier in Triton 3.6 (what the GPU hosts run), gl.barrier in later versions
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _stored_col(k, BK: gl.constexpr):
    """Real column k -> its position in activations stored in _to_mma_k's order per BK columns
    (k_order.stored_column in Gluon): the wgmma kernels' L1 writes h this way for their L2."""
    Q: gl.constexpr = BK // 4
    r = k % BK
    return (k // BK) * BK + 16 * ((r % Q) // 4) + 8 * (r % 2) + 2 * (r // Q) + (r // 2) % 2


@gluon.jit
def _block_slots(sorted_ids_ptr, t, num_slots):
    """Positions ``t`` of the routing blocks -> (slot, valid): padding holds num_slots or more."""
    slot = gl.load(sorted_ids_ptr + t)
    return slot, slot < num_slots


@gluon.jit
def _block_tokens(sorted_ids_ptr, t, num_slots, top_k):
    """Slots ``t`` of the routing blocks -> (token index, valid); padding slots give token 0."""
    slot, valid = _block_slots(sorted_ids_ptr, t, num_slots)
    return gl.where(valid, slot // top_k, 0).to(gl.int64), valid


@gluon.jit
def _l1_epilogue(acc, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit,
                 HAS_LIMIT: gl.constexpr, MMA: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr,
                 BKO: gl.constexpr):
    """Global scale, clamped SwiGLU of the interleaved gate/up rows, h stored bf16 (columns in
    _stored_col's order for BKO > 0, else in real order)."""
    gs = gl.load(gs_ptr + expert) * _TILE_UNSCALE
    acc = acc * gs
    # output pointers in the accumulator layout, then split gate (rows r%16 < 8) from up
    r_o = gl.arange(0, ROWS, layout=gl.SliceLayout(1, MMA))
    t_o = pid_m * BT + gl.arange(0, BT, layout=gl.SliceLayout(0, MMA))
    n_o = n0 + (r_o // 16) * 8 + r_o % 8
    if BKO > 0:
        n_o = _stored_col(n_o, BKO)
    o_ptrs = out_ptr + gl.expand_dims(t_o.to(gl.int64) * stride_om, 0) + gl.expand_dims(n_o, 1)
    acc4 = gl.permute(gl.reshape(acc, [ROWS // 16, 2, 8, BT]), [0, 2, 3, 1])
    gate, up = gl.split(acc4)
    p4 = gl.permute(gl.reshape(o_ptrs, [ROWS // 16, 2, 8, BT]), [0, 2, 3, 1])
    p_gate, _ = gl.split(p4)
    if HAS_LIMIT:
        gate = gl.minimum(gate, limit)
        up = gl.minimum(gl.maximum(up, -limit), limit)
    h = gate / (1.0 + gl.exp(-gate)) * up
    gl.store(p_gate, h.to(gl.bfloat16))


@gluon.jit
def _split_sum(acc, ws_ptr, cnt_ptr, tile, sorted_ids_ptr, num_slots, pid_m,
               MMA: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, SPLIT: gl.constexpr):
    """(sum, last) of the SPLIT runs' accumulators of one tile (split_k > 1): each run stores its valid
    columns in fp32 workspace ``ws[tile, run]`` and counts itself in ``cnt[tile]``; the last to arrive
    gets last = True and the sum of every run's in run order (the same bits whichever CTA is last),
    and sets the count back to 0 for the next launch."""
    r_o = gl.arange(0, ROWS, layout=gl.SliceLayout(1, MMA))
    t_l = gl.arange(0, BT, layout=gl.SliceLayout(0, MMA))
    _, valid = _block_slots(sorted_ids_ptr, pid_m * BT + t_l, num_slots)
    vm = gl.expand_dims(valid, 0)
    offs = gl.expand_dims(r_o, 1) * BT + gl.expand_dims(t_l, 0)
    base = ws_ptr + tile.to(gl.int64) * (SPLIT * ROWS * BT)
    gl.store(base + gl.program_id(2) * (ROWS * BT) + offs, acc, mask=vm)
    _cta_barrier()  # every thread's partial is written before the count says so (release, below)
    arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == SPLIT - 1
    tot = gl.zeros([ROWS, BT], gl.float32, layout=MMA)
    if last:
        for s in range(SPLIT):  # .cg: from L2, where the other SMs' stores are
            tot += gl.load(base + s * (ROWS * BT) + offs, mask=vm, other=0.0, cache_modifier=".cg")
        gl.store(cnt_ptr + tile, 0)
    return tot, last


@gluon.jit
def _l2_epilogue(acc, gs_ptr, expert, topk_w_ptr, out_ptr, stride_om, stride_os, sorted_ids_ptr, num_slots, n0,
                 pid_m, MMA: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, SPLIT: gl.constexpr):
    """Global scale times routing weight; each valid slot's row stored for the top-k sum: bf16, or
    (split_k > 1) this run's fp32 partial in buffer ``program_id(2)``."""
    gs = gl.load(gs_ptr + expert) * _TILE_UNSCALE
    t_o = pid_m * BT + gl.arange(0, BT, layout=gl.SliceLayout(0, MMA))
    slot, valid = _block_slots(sorted_ids_ptr, t_o, num_slots)
    route_w = gl.load(topk_w_ptr + slot, mask=valid, other=0.0)
    y = acc * gs * gl.expand_dims(route_w, 0)
    n_o = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, MMA))
    o_ptrs = out_ptr + gl.expand_dims(slot.to(gl.int64) * stride_om, 0) + gl.expand_dims(n_o, 1)
    if SPLIT == 1:
        gl.store(o_ptrs, y.to(gl.bfloat16), mask=gl.expand_dims(valid, 0))
    else:
        gl.store(o_ptrs + gl.program_id(2).to(gl.int64) * stride_os, y, mask=gl.expand_dims(valid, 0))


@gluon.jit
def _one_token_sum(rows_ptr, stride_om, stride_os, ids_ptr, top_k, sum_ptr, cnt_ptr, tile, n0,
                   MMA: gl.constexpr, ROWS: gl.constexpr, SPLIT: gl.constexpr):
    """The top-k sum of one token inside L2 (fused_moe's one-token routing: block j is slot j, ``ids`` the
    token's expert ids). This run has stored its rows (_l2_epilogue); it counts itself in ``cnt[tile]``, and
    the last of the token's live slots' runs to arrive adds every live slot's rows in topk_sum_kernel's
    order (slot-major, the runs inside, fp32, negative ids' rows masked to 0.0: the same bits), stores the
    token's output columns [n0, n0 + ROWS) and sets the count back to 0 for the next launch."""
    live = _live_slots(ids_ptr, top_k)
    _cta_barrier()  # every thread's rows are written before the count says so (release, below)
    arrived = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == live * SPLIT - 1:
        n_o = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, MMA))
        acc = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, MMA))
        for j in range(top_k):
            mine = (n_o >= 0) & (gl.load(ids_ptr + j) >= 0)
            row = rows_ptr + j * stride_om + n_o
            for s in range(SPLIT):  # .cg: from L2, where the other SMs' stores are
                acc += gl.load(row + s * stride_os, mask=mine, other=0.0, cache_modifier=".cg").to(gl.float32)
        gl.store(sum_ptr + n_o, acc.to(sum_ptr.dtype.element_ty))
        gl.store(cnt_ptr + tile, 0)


@gluon.jit
def _live_slots(ids_ptr, top_k):
    """How many of one token's top-k expert ids are this rank's (not negative)."""
    live = 0
    for j in range(top_k):
        live += (gl.load(ids_ptr + j) >= 0).to(gl.int32)
    return live


@gluon.jit
def _one_token_zeros(ids_ptr, top_k, sum_ptr, n0, pid_m, MMA: gl.constexpr, ROWS: gl.constexpr):
    """_one_token_sum where no slot of the token is this rank's (every block skipped, nothing to add): the
    first block's first run stores the zeros topk_sum_kernel would."""
    if pid_m == 0 and gl.program_id(2) == 0:
        if _live_slots(ids_ptr, top_k) == 0:
            n_o = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, MMA))
            gl.store(sum_ptr + n_o, gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, MMA))
                     .to(sum_ptr.dtype.element_ty))
