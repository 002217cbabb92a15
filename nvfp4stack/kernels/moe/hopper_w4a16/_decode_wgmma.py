"""Gluon wgmma decode kernels of the NVFP4 W4A16 MoE: the token tile is wgmma's B in shared memory.

Imported lazily, sm90 hosts only (Triton >= 3.6 with ``triton.experimental.gluon``).

Why: the mma.sync kernels (_decode_gluon.py) pay per token. Every warp loads the whole token
tile, permutes it into B fragments and issues one mma.sync per 8 tokens, so a 16-token block
costs ~1.5x the instructions of an 8-token one (bench/moe_kernel_notes_history.md, seventh pass). Here
the weights are dequantized exactly as there, straight into wgmma's A registers, and the
tokens are wgmma's N, read by the tensor core from shared memory: nothing per token is issued
by the warps. Row pointers and epilogues are _decode_gluon's.

Two ways to stage the operands (bench/moe_kernel_notes_history.md, eighth pass):
- RING (the tiles decode_pair picks): each K step's weight words and token tile arrive by
  cp.async in one ring of D + 1 slots, D steps in flight, the scales a round of D + 1 steps at a
  time (16 bytes per row; tenth pass); one CTA is one warpgroup.
- otherwise (sweep candidates): the token tile in chunks of CS K steps, two chunk buffers, one
  barrier per chunk; weights register-prefetched PD steps ahead; WAIT1 keeps one wgmma in flight.

cp.async copies bytes verbatim, so the activations must already be in the weights' K order (the
permutation of _decode_gluon._to_mma_k, per BK columns; k_order.py): L1 reads a permuted copy of
x (one gather launch), and L1 writes h permuted for L2's BK.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from nvfp4stack.kernels.moe.hopper_w4a16._decode_epilogue import _block_slots, _block_tokens, _l1_epilogue, _l2_epilogue
from nvfp4stack.kernels.moe.hopper_w4a16._decode_gluon import (
    _bytes_of,
    _dequant_a,
    _l1_weight_rows,
    _l2_weight_rows,
    _scales,
    _w_word_step,
    _w_words,
)
from nvfp4stack.kernels.moe.hopper_w4a16._decode_layouts import decode_layouts
from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import _block_expert


def wgmma_layouts(num_warps: int, mrep: int, block_t: int, block_k: int, chunk: int, slots: int = 0):
    """(MMA, W_BYTES, W_BLOCKS, W32, SMEM, COPY, XC, SC) for one CTA of ``num_warps`` (a multiple of 4);
    ``slots``: the ring's (DecodeConfig.ring_slots; XC and SC are the ring's copy layouts)."""
    assert num_warps % 4 == 0 and block_k % 64 == 0 and block_t in (8, 16, 32)
    _, w_bytes, w_blocks, _, (w32,) = decode_layouts(num_warps, mrep, block_t, block_k, prefetch=1)
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_t, 16])
    smem = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # the chunk [chunk * block_t, block_k] (row = step * block_t + token), 16 bytes per thread
    rows = chunk * block_t
    tk = min(block_k // 8, 32)
    tr = 32 // tk
    wr = max(1, min(num_warps, rows // tr))
    copy = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[tr, tk],
                            warps_per_cta=[wr, num_warps // wr], order=[1, 0])
    # one step's token tile [block_t, block_k] (the ring variant)
    wx = max(1, min(num_warps, block_t // tr))
    xc = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[tr, tk],
                          warps_per_cta=[wx, num_warps // wx], order=[1, 0])
    # the ring's scales of one round of ``slots`` K steps [rows, slots * block_k / 16] bytes, 16 per thread
    # (8-byte copies of one step's scales, rows 256 bytes apart, were 40% of the ring's shared-memory
    # wavefronts; 16-byte copies of a round took 3-17% off the ring: bench/moe_kernel_notes_history.md, tenth pass)
    cols = max(slots, 1) * block_k // 16
    ts_k = max(1, cols // 16)
    sc = gl.BlockedLayout(size_per_thread=[1, min(cols, 16)], threads_per_warp=[32 // ts_k, ts_k],
                          warps_per_cta=[num_warps, 1], order=[1, 0])
    return mma, w_bytes, w_blocks, w32, smem, copy, xc, sc


@gluon.jit
def _copy_chunk(buf, x_ptrs, k0):
    """cp.async of K columns [k0, k0 + CS*BK) of the block's token rows into buf [CS*BT, BK]
    (``x_ptrs``: [CS*BT, BK] pointers of the chunk at k0 = 0)."""
    async_copy.async_copy_global_to_shared(buf, x_ptrs + k0)
    async_copy.commit_group()


@gluon.jit
def _chunk_ready():
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _chunk_steps(buf, acc, w, sc, w2, sc2, w32_ptrs, s_ptrs, step0, NSTEPS,
                 MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr,
                 ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, CS: gl.constexpr,
                 PD: gl.constexpr, WAIT1: gl.constexpr, TILED: gl.constexpr):
    """CS K steps on one staged chunk. The weights of step i + PD load before step i's dequant (w/sc
    hold step i, w2/sc2 step i + 1 where PD == 2). WAIT1: step i's wgmma stays in flight while step
    i + 1 dequantizes (its A registers kept alive to the next wait); all done by the chunk's end."""
    a_prev = gl.zeros([ROWS, BK], gl.bfloat16, layout=gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
    for s in gl.static_range(CS):
        nxt = gl.minimum(step0 + s + PD, NSTEPS - 1)  # the last steps reload the last one: harmless
        w_n = gl.load(w32_ptrs + _w_word_step(nxt, BK, TILED))
        sc_n = gl.load(s_ptrs + nxt * (BK // 16))
        a = _dequant_a(_bytes_of(w, W_BYTES, ROWS, BK), _scales(sc), MMA, W_BLOCKS, ROWS, BK, TILED)
        acc = warpgroup_mma(a, buf.slice(s * BT, BT, dim=0).permute((1, 0)), acc, is_async=True)
        if WAIT1:
            acc, a_prev = warpgroup_mma_wait(1, deps=[acc, a_prev])
            a_prev = a
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
        if PD == 2:
            w = w2
            sc = sc2
            w2 = w_n
            sc2 = sc_n
        else:
            w = w_n
            sc = sc_n
    if WAIT1:  # the chunk's buffer is refilled after the next barrier: nothing may still read it
        acc, a_prev = warpgroup_mma_wait(0, deps=[acc, a_prev])
    return acc, w, sc, w2, sc2


@gluon.jit
def _gemm_rows_wgmma(w_row_ptr, s_row_ptr, x_row_ptr, K,
                     MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, W32: gl.constexpr,
                     SMEM: gl.constexpr, COPY: gl.constexpr,
                     ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, CS: gl.constexpr,
                     PD: gl.constexpr, WAIT1: gl.constexpr, TILED: gl.constexpr):
    S_L: gl.constexpr = gl.SliceLayout(2, W_BLOCKS)
    w32_row = gl.convert_layout(w_row_ptr, gl.SliceLayout(1, W32)).to(gl.pointer_type(gl.int32), bitcast=True)
    w32_ptrs = gl.expand_dims(w32_row, 1) + gl.expand_dims(_w_words(BK, gl.SliceLayout(0, W32), TILED), 0)
    s_ptrs = gl.expand_dims(s_row_ptr, 1) + gl.expand_dims(gl.arange(0, BK // 16, layout=gl.SliceLayout(0, S_L)), 0)

    # chunk row r = step * BT + token: x_row_ptr [CS*BT] (SliceLayout(1, COPY)) holds token r % BT's
    # row pointer plus (r // BT) * BK
    x_ptrs = gl.expand_dims(x_row_ptr, 1) + gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, COPY)), 0)
    buf_a = gl.allocate_shared_memory(gl.bfloat16, [CS * BT, BK], SMEM)
    buf_b = gl.allocate_shared_memory(gl.bfloat16, [CS * BT, BK], SMEM)
    _copy_chunk(buf_a, x_ptrs, 0)
    NSTEPS = K // BK
    w = gl.load(w32_ptrs)
    sc = gl.load(s_ptrs)
    if PD == 2:
        w2 = gl.load(w32_ptrs + _w_word_step(1, BK, TILED))
        sc2 = gl.load(s_ptrs + BK // 16)
    else:
        w2 = w
        sc2 = sc
    acc = gl.zeros([ROWS, BT], gl.float32, layout=MMA)
    for c0 in range(0, NSTEPS, 2 * CS):  # NSTEPS is a multiple of 2*CS (DecodeConfig.fits)
        _chunk_ready()  # chunk c0 in buf_a; every warp is done with buf_b
        _copy_chunk(buf_b, x_ptrs, (c0 + CS) * BK)
        acc, w, sc, w2, sc2 = _chunk_steps(buf_a, acc, w, sc, w2, sc2, w32_ptrs, s_ptrs, c0, NSTEPS,
                                           MMA, W_BYTES, W_BLOCKS, ROWS, BT, BK, CS, PD, WAIT1, TILED)
        _chunk_ready()  # chunk c0 + CS in buf_b; every warp is done with buf_a
        if c0 + 2 * CS < NSTEPS:
            _copy_chunk(buf_a, x_ptrs, (c0 + 2 * CS) * BK)
        acc, w, sc, w2, sc2 = _chunk_steps(buf_b, acc, w, sc, w2, sc2, w32_ptrs, s_ptrs, c0 + CS, NSTEPS,
                                           MMA, W_BYTES, W_BLOCKS, ROWS, BT, BK, CS, PD, WAIT1, TILED)
    return acc


@gluon.jit
def _ring_issue(step, NSTEPS, w_slot, x_slot, w32_ptrs, x_step_ptrs, x_mask, BK: gl.constexpr, TILED: gl.constexpr):
    """One cp.async group: K step ``step``'s weight words and token tile into one ring slot
    (an empty group past the last step, so that the group count stays uniform). Padding token rows
    (x_mask false) are zero-filled, not read: a 32-token tile at 16 rows per expert is half padding,
    and reading it cost the 32-token ring 9-18% (bench/moe_kernel_notes_history.md, ninth pass)."""
    if step < NSTEPS:
        async_copy.async_copy_global_to_shared(w_slot, w32_ptrs + _w_word_step(step, BK, TILED))
        async_copy.async_copy_global_to_shared(x_slot, x_step_ptrs + step * BK, mask=x_mask)
    async_copy.commit_group()


@gluon.jit
def _gemm_rows_ring(w_row_ptr, s_row_ptr, x_row_ptr, x_valid, K,
                    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, W32: gl.constexpr,
                    SMEM: gl.constexpr, SC: gl.constexpr, XC: gl.constexpr,
                    ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, D: gl.constexpr, TILED: gl.constexpr):
    """Weights and token tiles through one cp.async ring of S = D + 1 slots, D K steps in flight,
    nothing loaded into registers from global memory inside the loop (the proxy fence of every
    step would wait for such loads). The loop is unrolled by S so that every slot index is static:
    the compiler then sees that the slot being filled is not the one being read and adds no
    barrier of its own; one barrier per step remains. NSTEPS must be a multiple of S.

    The scales arrive a round (S steps) at a time, 16 bytes per row, into two round buffers: round
    r + 1's copy joins the cp.async group of round r's first step and has landed before round r + 1
    starts; its buffer was last read in round r - 1, which every warp has left at that barrier.

    x_row_ptr / x_valid [BT] (layout SliceLayout(1, XC)): each token row's pointer, and whether the
    row is a routed slot (padding rows are zero-filled, not read)."""
    S: gl.constexpr = D + 1
    SR: gl.constexpr = S * (BK // 16)  # scale bytes per row and round
    S_L: gl.constexpr = gl.SliceLayout(2, W_BLOCKS)
    w32_row = gl.convert_layout(w_row_ptr, gl.SliceLayout(1, W32)).to(gl.pointer_type(gl.int32), bitcast=True)
    w32_ptrs = gl.expand_dims(w32_row, 1) + gl.expand_dims(_w_words(BK, gl.SliceLayout(0, W32), TILED), 0)
    sc_row = gl.convert_layout(s_row_ptr, gl.SliceLayout(1, SC))
    sc_ptrs = gl.expand_dims(sc_row, 1) + gl.expand_dims(gl.arange(0, SR, layout=gl.SliceLayout(0, SC)), 0)
    k_x = gl.expand_dims(gl.arange(0, BK, layout=gl.SliceLayout(0, XC)), 0)
    x_step_ptrs = gl.expand_dims(x_row_ptr, 1) + k_x
    x_mask = gl.expand_dims(x_valid, 1) & (k_x >= 0)
    plain: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    w_ring = gl.allocate_shared_memory(gl.int32, [S, ROWS, BK // 8], plain)
    s_rounds = gl.allocate_shared_memory(gl.uint8, [2, ROWS, SR], plain)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [S, BT, BK], SMEM)
    NSTEPS = K // BK
    async_copy.async_copy_global_to_shared(s_rounds.index(0), sc_ptrs)  # round 0, in step 0's group
    for j in gl.static_range(D):
        _ring_issue(j, NSTEPS, w_ring.index(j), x_ring.index(j), w32_ptrs, x_step_ptrs, x_mask, BK, TILED)
    acc = gl.zeros([ROWS, BT], gl.float32, layout=MMA)
    for i0 in range(0, NSTEPS, S):
        r = i0 // S
        for s in gl.static_range(S):
            async_copy.wait_group(D - 1)  # step i0 + s has landed
            fence_async_shared()
            gl.thread_barrier()  # ... for every thread, and every warp is done with the previous step's slot
            if s == 0:
                if i0 + S < NSTEPS:
                    async_copy.async_copy_global_to_shared(s_rounds.index((r + 1) % 2), sc_ptrs + (i0 + S) * (BK // 16))
            _ring_issue(i0 + s + D, NSTEPS, w_ring.index((s + D) % S), x_ring.index((s + D) % S), w32_ptrs,
                        x_step_ptrs, x_mask, BK, TILED)
            w = w_ring.index(s).load(W32)
            sc = s_rounds.index(r % 2).slice(s * (BK // 16), BK // 16, dim=1).load(S_L)
            a = _dequant_a(_bytes_of(w, W_BYTES, ROWS, BK), _scales(sc), MMA, W_BLOCKS, ROWS, BK, TILED)
            acc = warpgroup_mma(a, x_ring.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
    async_copy.wait_group(0)
    return acc


@gluon.jit(do_not_specialize=["num_slots"])
def l1_swiglu_wgmma_kernel(
    # the operands of _decode_gluon.l1_swiglu_decode_kernel; x is K-permuted for BK, h is written
    # K-permuted for BKO (the L2 kernel's block_k)
    x_ptr, stride_xm, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, out_ptr, stride_om,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, top_k, I, H, limit,
    HAS_LIMIT: gl.constexpr,
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, W32: gl.constexpr,
    SMEM: gl.constexpr, COPY: gl.constexpr,
    ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, CS: gl.constexpr, BKO: gl.constexpr,
    PD: gl.constexpr, WAIT1: gl.constexpr, RING: gl.constexpr, XC: gl.constexpr, SC: gl.constexpr,
    TILED: gl.constexpr,
):
    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BT)
    if expert < 0:
        return
    HALF: gl.constexpr = ROWS // 2
    n0 = pid_n * HALF

    w_row, s_row = _l1_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I, H,
                                   W_BYTES, W_BLOCKS, ROWS, TILED)
    # token rows (padding slots: token 0 in the staged variants, zeros in the ring; never combined)
    if RING:
        t = gl.arange(0, BT, layout=gl.SliceLayout(1, XC))
        tok, valid = _block_tokens(sorted_ids_ptr, pid_m * BT + t, num_slots, top_k)
        acc = _gemm_rows_ring(w_row, s_row, x_ptr + tok * stride_xm, valid, H, MMA, W_BYTES, W_BLOCKS, W32, SMEM, SC, XC,
                              ROWS, BT, BK, PD, TILED)
    else:  # chunk row r = step * BT + token
        r = gl.arange(0, CS * BT, layout=gl.SliceLayout(1, COPY))
        tok, _ = _block_tokens(sorted_ids_ptr, pid_m * BT + r % BT, num_slots, top_k)
        x_row = x_ptr + tok * stride_xm + (r // BT) * BK
        acc = _gemm_rows_wgmma(w_row, s_row, x_row, H, MMA, W_BYTES, W_BLOCKS, W32, SMEM, COPY, ROWS, BT, BK, CS, PD, WAIT1,
                               TILED)
    _l1_epilogue(acc, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit, HAS_LIMIT, MMA, ROWS, BT, BKO)


@gluon.jit(do_not_specialize=["num_slots"])
def l2_wgmma_kernel(
    # the operands of _decode_gluon.l2_decode_kernel; a (h) is K-permuted for BK
    a_ptr, stride_am, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, topk_w_ptr,
    out_ptr, stride_om, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, H, I,
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, W32: gl.constexpr,
    SMEM: gl.constexpr, COPY: gl.constexpr,
    ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, CS: gl.constexpr,
    PD: gl.constexpr, WAIT1: gl.constexpr, RING: gl.constexpr, XC: gl.constexpr, SC: gl.constexpr,
    TILED: gl.constexpr,
):
    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BT)
    if expert < 0:
        return
    n0 = pid_n * ROWS

    w_row, s_row = _l2_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I,
                                   W_BYTES, W_BLOCKS, ROWS, TILED)
    # L1 wrote every row of this block (padding rows too); the ring reads only the valid ones
    if RING:
        t = pid_m * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, XC))
        _, valid = _block_slots(sorted_ids_ptr, t, num_slots)
        acc = _gemm_rows_ring(w_row, s_row, a_ptr + t.to(gl.int64) * stride_am, valid, I, MMA, W_BYTES, W_BLOCKS, W32,
                              SMEM, SC, XC, ROWS, BT, BK, PD, TILED)
    else:  # chunk row r = step * BT + token
        r = gl.arange(0, CS * BT, layout=gl.SliceLayout(1, COPY))
        x_row = a_ptr + (pid_m * BT + r % BT).to(gl.int64) * stride_am + (r // BT) * BK
        acc = _gemm_rows_wgmma(w_row, s_row, x_row, I, MMA, W_BYTES, W_BLOCKS, W32, SMEM, COPY, ROWS, BT, BK, CS, PD, WAIT1,
                               TILED)
    _l2_epilogue(acc, gs_ptr, expert, topk_w_ptr, out_ptr, stride_om, 0, sorted_ids_ptr, num_slots, n0, pid_m,
                 MMA, ROWS, BT, 1)


def launch(cfg1, cfg2, l1_args: tuple, l2_args: tuple, nblocks: int, inter: int, hidden: int,
           limit: float, has_limit: bool, tiled: bool) -> None:
    """Both GEMMs on (L1, L2) wgmma DecodeConfig tiles; l1_args carry x already K-permuted for cfg1
    (``tiled``: the weights in tiles.py's layout)."""
    def consts(c, k: int) -> dict:
        cs = c.chunk_steps(k)
        mma, w_bytes, w_blocks, w32, smem, copy, xc, sc = wgmma_layouts(c.num_warps, c.mrep, c.block_t, c.block_k, cs,
                                                                        c.ring_slots)
        return dict(MMA=mma, W_BYTES=w_bytes, W_BLOCKS=w_blocks, W32=w32, SMEM=smem, COPY=copy, XC=xc, SC=sc, ROWS=c.rows,
                    BT=c.block_t, BK=c.block_k, CS=cs, PD=c.prefetch, WAIT1=c.wgmma == 2, RING=c.wgmma == 3,
                    TILED=tiled, num_warps=c.num_warps)

    l1_swiglu_wgmma_kernel[(inter // (cfg1.rows // 2), nblocks)](
        *l1_args, limit, HAS_LIMIT=has_limit, BKO=cfg2.block_k, **consts(cfg1, hidden))
    l2_wgmma_kernel[(hidden // cfg2.rows, nblocks)](*l2_args, **consts(cfg2, inter))
