"""PROTOTYPE (scratch): the mma.sync decode pair with warp-specialized weight loads.

A producer partition (1 warp) streams each CTA's weight tiles by TMA into a ring of STAGES K steps in shared memory,
with a ready and an empty mbarrier a slot; the default partition (the tile's mma.sync warps) waits on ready, reads
the slot as int32 words, arrives on empty and does _decode_gluon._gemm_rows' math (same steps, order, dequant and
fragments: the bits of the register-load tile of the same block_t, block_k and split_k). No CTA barrier in the loop.
Built from git 07ad451's _decode_tma.py. Installed by monkeypatching _decode_gluon.launch (install()).
"""
from __future__ import annotations

from dataclasses import replace

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as dg
from nvfp4stack.kernels.moe.hopper_w4a16._decode_epilogue import (
    _block_tokens,
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
from nvfp4stack.kernels.moe.hopper_w4a16._decode_layouts import _w_bases, decode_layouts
from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import _block_expert
from nvfp4stack.kernels.moe.hopper_w4a16.decode_buffers import split_workspace, tile_counters

LINE = 64
SETTINGS = dict(stages=4, split1=1, maxnreg=80, l1_warps=0)  # split1 None: the pick's L1 split (L2 keeps the pick's: its buffers)


def line_layout(num_warps: int, mrep: int, block_k: int):
    def line(basis):
        r, c = basis
        return [(r // 64) * (block_k // 2) + (c // 16) * 64 + r % 64, c % 16]
    bases = {k: [line(b) for b in v] for k, v in _w_bases(num_warps, mrep, block_k, 4).items()}
    return gl.DistributedLinearLayout(**bases, block_bases=[], shape=[16 * num_warps * mrep // 64 * block_k // 2, 16])


@gluon.jit
def _producer(w_desc, ring, ready, empty, line0, rb_lines, n, RB: gl.constexpr, LINES: gl.constexpr,
              STAGES: gl.constexpr):
    BOX: gl.constexpr = w_desc.block_type.shape[0]
    for i in range(n):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        bar = ready.index(s)
        mbarrier.expect(bar, RB * w_desc.block_type.nbytes)
        for rb in gl.static_range(RB):
            tma.async_copy_global_to_shared(w_desc, [line0 + i * LINES + rb * rb_lines, 0], bar,
                                            ring.index(s).slice(rb * BOX, BOX))


@gluon.jit
def _consumer(ring, ready, empty, s_ptrs, x_ptrs, xm, k_lo, n,
              MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, W_LINES: gl.constexpr,
              W32: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
              WAIT: gl.constexpr):
    RB: gl.constexpr = ROWS // 64
    LINES: gl.constexpr = BK // 2
    WORDS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)
    if WAIT:
        gdc_wait()
    acc = gl.zeros([ROWS, BT], gl.float32, layout=MMA)
    for i in range(n):
        k0 = k_lo + i * BK
        sc = gl.load(s_ptrs + k0 // 16)
        x = gl.load(x_ptrs + k0, mask=xm, other=0.0)
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        w3 = ring.index(s)._reinterpret(gl.int32, [RB * LINES, 16], WORDS).load(W_LINES)
        fence_async_shared()
        mbarrier.arrive(empty.index(s), count=1)
        w4 = gl.permute(gl.reshape(w3, [RB, BK // 128, 64, 16]), [0, 2, 1, 3])
        w = gl.convert_layout(gl.reshape(w4, [ROWS, BK // 8]), W32, assert_trivial=True)
        a = _dequant_a(_bytes_of(w, W_BYTES, ROWS, BK), _scales(sc), MMA, W_BLOCKS, ROWS, BK, True)
        acc = mma_v2(a, _x_operand(x, MMA, BT, BK), acc)
    return (acc,)  # warp_specialize flattens the default partition's results: a tuple


@gluon.jit
def _gemm_rows_ws(w_desc, line0, rb_lines, s_row_ptr, x_row_ptr, x_mask, k_lo, k_hi,
                  MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr,
                  W_LINES: gl.constexpr, W32: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
                  STAGES: gl.constexpr, WAIT: gl.constexpr):
    RB: gl.constexpr = ROWS // 64
    LINES: gl.constexpr = BK // 2
    ring = gl.allocate_shared_memory(gl.uint8, [STAGES, RB * LINES, 64], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    S_L: gl.constexpr = gl.SliceLayout(2, W_BLOCKS)
    offs_sb = gl.arange(0, BK // 16, layout=gl.SliceLayout(0, S_L))
    offs_xk = gl.arange(0, BK, layout=gl.SliceLayout(0, X_L))
    s_ptrs = gl.expand_dims(s_row_ptr, 1) + gl.expand_dims(offs_sb, 0)
    x_ptrs = gl.expand_dims(x_row_ptr, 1) + gl.expand_dims(offs_xk, 0)
    xm = gl.expand_dims(x_mask, 1)
    n = (k_hi - k_lo) // BK
    res = gl.warp_specialize([
        (_consumer, (ring, ready, empty, s_ptrs, x_ptrs, xm, k_lo, n, MMA, W_BYTES, W_BLOCKS, W_LINES, W32, ROWS, BT,
                     BK, STAGES, WAIT)),
        (_producer, (w_desc, ring, ready, empty, line0, rb_lines, n, RB, LINES, STAGES)),
    ], [1], [24])
    return res[0]


@gluon.jit
def _line(w_row_byte, k_lo):
    return ((w_row_byte + (k_lo // 128) * 4096) // 64).to(gl.int32)


@gluon.jit(do_not_specialize=["num_slots"])
def l1_ws_kernel(w_desc, x_ptr, stride_xm, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, out_ptr,
                 stride_om, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, top_k, I, H, limit, ws_ptr,
                 cnt_ptr, HAS_LIMIT: gl.constexpr, MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr,
                 X_L: gl.constexpr, W_LINES: gl.constexpr, W32: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr,
                 BK: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr, PDL: gl.constexpr):
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
    line0 = _line(expert * stride_we + (2 * n0 // 64).to(gl.int64) * (32 * H), k_lo)
    acc = _gemm_rows_ws(w_desc, line0, H // 2, s_row, x_row, valid, k_lo, k_hi, MMA, W_BYTES, W_BLOCKS, X_L,
                        W_LINES, W32, ROWS, BT, BK, STAGES, False)
    if SPLIT == 1:
        _l1_epilogue(acc, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit, HAS_LIMIT, MMA, ROWS, BT, 0)
    else:
        tot, last = _split_sum(acc, ws_ptr, cnt_ptr, pid_m * gl.num_programs(0) + pid_n, sorted_ids_ptr, num_slots,
                               pid_m, MMA, ROWS, BT, SPLIT)
        if last:
            _l1_epilogue(tot, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit, HAS_LIMIT, MMA, ROWS, BT, 0)


@gluon.jit(do_not_specialize=["num_slots"])
def l2_ws_kernel(w_desc, a_ptr, stride_am, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, topk_w_ptr,
                 out_ptr, stride_om, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, H, I,
                 stride_os, sum_ptr, sum_cnt_ptr, top_k,
                 MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr,
                 W_LINES: gl.constexpr, W32: gl.constexpr, ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
                 STAGES: gl.constexpr, SPLIT: gl.constexpr, FUSE_SUM: gl.constexpr, PDL: gl.constexpr):
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
    acc = _gemm_rows_ws(w_desc, line0, I // 2, s_row, a_row, offs_t >= 0, k_lo, k_hi, MMA, W_BYTES, W_BLOCKS,
                        X_L, W_LINES, W32, ROWS, BT, BK, STAGES, PDL)
    _l2_epilogue(acc, gs_ptr, expert, topk_w_ptr, out_ptr, stride_om, stride_os, sorted_ids_ptr, num_slots, n0,
                 pid_m, MMA, ROWS, BT, SPLIT)
    if FUSE_SUM:
        _one_token_sum(out_ptr, stride_om, stride_os, expert_ids_ptr, top_k, sum_ptr, sum_cnt_ptr, pid_n, n0, MMA,
                       ROWS, SPLIT)


def weight_descriptor(w, block_k: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    return TensorDescriptor(w, [w.numel() // LINE, LINE], [LINE, 1], [block_k // 2, LINE], layout)


def layouts(c, stages: int, maxnreg: int) -> dict:
    mma, w_bytes, w_blocks, x_l, (w32,) = decode_layouts(c.num_warps, c.mrep, c.block_t, c.block_k, 1)
    return dict(MMA=mma, W_BYTES=w_bytes, W_BLOCKS=w_blocks, X_L=x_l, W32=w32,
                W_LINES=line_layout(c.num_warps, c.mrep, c.block_k), ROWS=c.rows, BT=c.block_t,
                BK=c.block_k, STAGES=stages, SPLIT=c.split_k, num_warps=c.num_warps, maxnreg=maxnreg)


def launch(cfg1, cfg2, l1_args, l2_args, nblocks, inter, hidden, limit, has_limit, tiled, rows_split_stride=0,
           fused_sum=None, pdl=False):
    assert tiled, "the warp-specialized prototype reads tiles.py's layout only"
    st, mr = SETTINGS["stages"], SETTINGS["maxnreg"]
    if SETTINGS["split1"]:
        cfg1 = replace(cfg1, split_k=SETTINGS["split1"])
    if SETTINGS["l1_warps"]:  # L1's rows over fewer warps (64-row tiles at 4: the grid's CTAs fit 3 an SM)
        cfg1 = replace(cfg1, num_warps=SETTINGS["l1_warps"])
    n_tiles = inter // (cfg1.rows // 2)
    ws, counts = split_workspace(cfg1, n_tiles * nblocks, l1_args[0].device)
    l1_ws_kernel[(n_tiles, nblocks, cfg1.split_k)](
        weight_descriptor(l1_args[2], cfg1.block_k), *l1_args, limit, ws, counts, HAS_LIMIT=has_limit, PDL=pdl,
        **layouts(cfg1, st, mr))
    out, top_k = fused_sum or (counts, 0)
    sum_counts = tile_counters(hidden // cfg2.rows, out.device, "the one-token top-k sum", cfg2) if fused_sum \
        else counts
    l2_ws_kernel[(hidden // cfg2.rows, nblocks, cfg2.split_k)](
        weight_descriptor(l2_args[2], cfg2.block_k), *l2_args, rows_split_stride, out, sum_counts, top_k,
        FUSE_SUM=fused_sum is not None, PDL=pdl, launch_pdl=pdl, **layouts(cfg2, st, mr))


def install(**settings) -> None:
    SETTINGS.update(settings)
    dg.launch = launch
