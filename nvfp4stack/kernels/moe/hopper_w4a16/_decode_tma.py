"""The mma.sync decode pair with its weight tiles brought by TMA into a shared-memory ring (``DecodeConfig.tma``).

Imported lazily, GPU hosts only (Triton >= 3.6 with ``triton.experimental.gluon``).

Why: at one token the register-load kernels (_decode_gluon.py) keep too few weight bytes in flight (each warp
waits for its own loads; the grid gives 1.5-3 CTAs an SM), and reach 41-45% of the H200's HBM. Here each CTA
asks for its first ``tma`` K steps of weights at its start (one TMA copy per 64-row block of the tile: tiles.py's
layout stores a row block's K step as contiguous 64-byte lines) and refills a slot as soon as every warp has
read it, so the bytes in flight no longer depend on the warps.

The math is _decode_gluon._gemm_rows' (same K steps in the same order, same dequant, same mma.sync fragments), so a
TMA tile gives the bits of the register-load tile with the same block_t, block_k and split_k. Scales and
activations are loaded from global memory one K step ahead, into registers.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nvfp4stack.kernels.moe.hopper_w4a16._decode_epilogue import (
    _block_tokens,
    _cta_barrier,
    _l1_epilogue,
    _l2_epilogue,
    _one_token_sum,
    _one_token_zeros,
    _split_sum,
)
from nvfp4stack.kernels.moe.hopper_w4a16._decode_gluon import (
    _bytes_of,
    _dequant_a,
    _k_run,
    _l1_weight_rows,
    _l2_weight_rows,
    _scales,
    _x_operand,
)
from nvfp4stack.kernels.moe.hopper_w4a16._decode_layouts import decode_layouts, line_layout
from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import _block_expert
from nvfp4stack.kernels.moe.hopper_w4a16.decode_buffers import split_workspace, tile_counters

LINE = 64  # bytes of a row's share of a 64-row x 64-byte atom (tiles.py): the unit of the addressing below
# bytes of a line of the TMA view: 64 (one atom row, 64-byte swizzle) or 256 (four, unswizzled: the 8 KB of a row
# block's K step are contiguous either way)
LINE_BYTES = 64


@gluon.jit
def _issue(w_desc, bar, slot, line, rb_lines, RB: gl.constexpr, pred):
    """The RB row blocks of one K step into ring slot ``slot``, arriving on ``bar`` (``line``, ``rb_lines`` in
    64-byte lines; the view's lines may be wider)."""
    BOX: gl.constexpr = w_desc.block_type.shape[0]
    Q: gl.constexpr = w_desc.block_type.shape[1] // 64
    mbarrier.expect(bar, RB * w_desc.block_type.nbytes, pred=pred)
    for rb in gl.static_range(RB):
        tma.async_copy_global_to_shared(w_desc, [(line + rb * rb_lines) // Q, 0], bar, slot.slice(rb * BOX, BOX),
                                        pred=pred)


@gluon.jit
def _gemm_rows_tma(
    w_desc, line0, rb_lines,  # the tile's first row block's line at K column k_lo; lines between its row blocks
    s_row_ptr, x_row_ptr, x_mask, k_lo, k_hi,  # as _decode_gluon._gemm_rows
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr, W_LINES: gl.constexpr,
    W32: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
    WAIT: gl.constexpr,
):
    RB: gl.constexpr = ROWS // 64
    LINES: gl.constexpr = BK // 2  # lines of one row block's K step (BK/128 atoms of 64 lines)
    LB: gl.constexpr = w_desc.block_type.shape[1]
    ring = gl.allocate_shared_memory(gl.uint8, [STAGES, RB * LINES * 64 // LB, LB], w_desc.layout)
    # the same bytes as int32 words, 16 a 64-byte line
    WORDS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64 if LB == 64 else 0, element_bitwidth=32, rank=2)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    _cta_barrier()
    n = (k_hi - k_lo) // BK
    for i in gl.static_range(STAGES):
        _issue(w_desc, bars.index(i), ring.index(i), line0 + i * LINES, rb_lines, RB, i < n)

    S_L: gl.constexpr = gl.SliceLayout(2, W_BLOCKS)
    offs_sb = gl.arange(0, BK // 16, layout=gl.SliceLayout(0, S_L))
    offs_xk = gl.arange(0, BK, layout=gl.SliceLayout(0, X_L))
    s_ptrs = gl.expand_dims(s_row_ptr, 1) + gl.expand_dims(offs_sb, 0)
    x_ptrs = gl.expand_dims(x_row_ptr, 1) + gl.expand_dims(offs_xk, 0)
    xm = gl.expand_dims(x_mask, 1)
    if WAIT:  # the first weights are on their way: now wait for the activations' writer
        gdc_wait()
    acc = gl.zeros([ROWS, BT], gl.float32, layout=MMA)
    for i in range(n):
        k0 = k_lo + i * BK
        sc = gl.load(s_ptrs + k0 // 16)  # in flight while the slot's wait lasts
        x = gl.load(x_ptrs + k0, mask=xm, other=0.0)
        s = i % STAGES
        mbarrier.wait(bars.index(s), (i // STAGES) & 1)
        w3 = ring.index(s)._reinterpret(gl.int32, [RB * LINES, 16], WORDS).load(W_LINES)  # [RB * LINES, 16]
        fence_async_shared()
        _cta_barrier()  # every warp has read slot s: refill it with step i + STAGES
        _issue(w_desc, bars.index(s), ring.index(s), line0 + (i + STAGES) * LINES, rb_lines, RB, i + STAGES < n)
        w4 = gl.permute(gl.reshape(w3, [RB, BK // 128, 64, 16]), [0, 2, 1, 3])
        w = gl.convert_layout(gl.reshape(w4, [ROWS, BK // 8]), W32, assert_trivial=True)
        a = _dequant_a(_bytes_of(w, W_BYTES, ROWS, BK), _scales(sc), MMA, W_BLOCKS, ROWS, BK, True)
        acc = mma_v2(a, _x_operand(x, MMA, BT, BK), acc)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    return acc


@gluon.jit
def _line(w_row_byte, k_lo):
    """Line (64 bytes) of a row block's first byte ``w_row_byte`` (int64, tiled) at K column k_lo (a whole atom)."""
    return ((w_row_byte + (k_lo // 128) * 4096) // 64).to(gl.int32)


@gluon.jit(do_not_specialize=["num_slots"])
def l1_swiglu_tma_kernel(
    # _decode_gluon.l1_swiglu_decode_kernel's operands, the weights' TMA descriptor first
    w_desc, x_ptr, stride_xm, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, out_ptr, stride_om,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, top_k, I, H, limit, ws_ptr, cnt_ptr,
    HAS_LIMIT: gl.constexpr,
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr, W_LINES: gl.constexpr,
    W32: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
    SPLIT: gl.constexpr,
    PDL: gl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BT)
    if expert < 0:
        return
    HALF: gl.constexpr = ROWS // 2
    n0 = pid_n * HALF
    offs_t = pid_m * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, X_L))
    tok, valid = _block_tokens(sorted_ids_ptr, offs_t, num_slots, top_k)
    x_row = x_ptr + tok * stride_xm
    _, s_row = _l1_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I, H,
                               W_BYTES, W_BLOCKS, ROWS, True)
    k_lo, k_hi = _k_run(H, BK, SPLIT)
    # tiled rows 2*n0 .. 2*n0 + ROWS (tiles.l1_row's order): row block 2*n0/64 of the expert, blocks 32*H bytes apart
    line0 = _line(expert * stride_we + (2 * n0 // 64).to(gl.int64) * (32 * H), k_lo)
    acc = _gemm_rows_tma(w_desc, line0, H // 2, s_row, x_row, valid, k_lo, k_hi, MMA, W_BYTES, W_BLOCKS, X_L,
                         W_LINES, W32, ROWS, BT, BK, STAGES, False)
    if SPLIT == 1:
        _l1_epilogue(acc, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit, HAS_LIMIT, MMA, ROWS, BT, 0)
    else:
        tot, last = _split_sum(acc, ws_ptr, cnt_ptr, pid_m * gl.num_programs(0) + pid_n, sorted_ids_ptr, num_slots,
                               pid_m, MMA, ROWS, BT, SPLIT)
        if last:
            _l1_epilogue(tot, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit, HAS_LIMIT, MMA, ROWS, BT, 0)


@gluon.jit(do_not_specialize=["num_slots"])
def l2_tma_kernel(
    # _decode_gluon.l2_decode_kernel's operands, the weights' TMA descriptor first
    w_desc, a_ptr, stride_am, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, topk_w_ptr,
    out_ptr, stride_om, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, H, I,
    stride_os, sum_ptr, sum_cnt_ptr, top_k,
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr, W_LINES: gl.constexpr,
    W32: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
    SPLIT: gl.constexpr,
    FUSE_SUM: gl.constexpr, PDL: gl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    n0 = pid_n * ROWS
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BT)
    if expert < 0:
        if FUSE_SUM:
            if PDL:
                gdc_wait()
            _one_token_zeros(expert_ids_ptr, top_k, sum_ptr, n0, pid_m, MMA, ROWS)
        return
    offs_t = pid_m * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, X_L))
    a_row = a_ptr + offs_t.to(gl.int64) * stride_am
    _, s_row = _l2_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I,
                               W_BYTES, W_BLOCKS, ROWS, True)
    k_lo, k_hi = _k_run(I, BK, SPLIT)
    line0 = _line(expert * stride_we + (n0 // 64).to(gl.int64) * (32 * I), k_lo)
    acc = _gemm_rows_tma(w_desc, line0, I // 2, s_row, a_row, offs_t >= 0, k_lo, k_hi, MMA, W_BYTES, W_BLOCKS,
                         X_L, W_LINES, W32, ROWS, BT, BK, STAGES, PDL)
    _l2_epilogue(acc, gs_ptr, expert, topk_w_ptr, out_ptr, stride_om, stride_os, sorted_ids_ptr, num_slots, n0,
                 pid_m, MMA, ROWS, BT, SPLIT)
    if FUSE_SUM:
        _one_token_sum(out_ptr, stride_om, stride_os, expert_ids_ptr, top_k, sum_ptr, sum_cnt_ptr, pid_n, n0, MMA,
                       ROWS, SPLIT)


def weight_descriptor(w, block_k: int):
    """TMA descriptor of tiled packed weights ``w`` ([E, N, K/2] uint8, tiles.py's layout) as [E*N*K/128, 64] lines,
    one box = one 64-row block's K step of ``block_k`` columns (block_k/2 lines)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    lb = LINE_BYTES
    layout = gl.NVMMASharedLayout(swizzle_byte_width=64 if lb == 64 else 0, element_bitwidth=8, rank=2)
    return TensorDescriptor(w, [w.numel() // lb, lb], [lb, 1], [block_k // 2 * LINE // lb, lb], layout)


def launch(cfg1, cfg2, l1_args: tuple, l2_args: tuple, nblocks: int, inter: int, hidden: int, limit: float,
           has_limit: bool, rows_split_stride: int = 0, fused_sum=None, pdl: bool = False) -> None:
    """_decode_gluon.launch for TMA tiles (tiled weights only; DecodeConfig.tma)."""
    def layouts(c) -> dict:
        mma, w_bytes, w_blocks, x_l, (w32,) = decode_layouts(c.num_warps, c.mrep, c.block_t, c.block_k, 1)
        return dict(MMA=mma, W_BYTES=w_bytes, W_BLOCKS=w_blocks, X_L=x_l, W32=w32,
                    W_LINES=line_layout(c.num_warps, c.mrep, c.block_k), ROWS=c.rows, BT=c.block_t,
                    BK=c.block_k, STAGES=c.tma, SPLIT=c.split_k, num_warps=c.num_warps)

    n_tiles = inter // (cfg1.rows // 2)
    ws, counts = split_workspace(cfg1, n_tiles * nblocks, l1_args[0].device)
    l1_swiglu_tma_kernel[(n_tiles, nblocks, cfg1.split_k)](
        weight_descriptor(l1_args[2], cfg1.block_k), *l1_args, limit, ws, counts, HAS_LIMIT=has_limit, PDL=pdl,
        **layouts(cfg1))
    out, top_k = fused_sum or (counts, 0)
    sum_counts = tile_counters(hidden // cfg2.rows, out.device, "the one-token top-k sum", cfg2) if fused_sum \
        else counts
    l2_tma_kernel[(hidden // cfg2.rows, nblocks, cfg2.split_k)](
        weight_descriptor(l2_args[2], cfg2.block_k), *l2_args, rows_split_stride, out, sum_counts, top_k,
        FUSE_SUM=fused_sum is not None, PDL=pdl, launch_pdl=pdl, **layouts(cfg2))
