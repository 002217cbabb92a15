"""Gluon decode kernels of the NVFP4 W4A16 MoE: dequantized weights feed mma.sync from registers.

Imported lazily, GPU hosts only (Triton >= 3.6 with ``triton.experimental.gluon``).

Why a second kernel: the Triton path (_triton_kernels.py) has the tokens as the MMA's M
side and the dequantized weight tile as B, which Triton stages through shared memory before
every MMA; at decode that round trip alone caps it at 2.75x (Flash) / 3.4x (Pro) bf16.
Here the operands are swapped (out^T = W x^T): weight rows are M (16-row mma.sync tiles), the
8/16/32 tokens of one routing block are N, and both operands are built in registers in the exact
mma.sync fragment layouts, so nothing goes through shared memory.

The K order inside one BK tile is permuted, identically for both operands (a dot product does
not care): thread t of a lane quad owns the contiguous real columns [t*BK/4, (t+1)*BK/4), so
its weight bytes (16 for BK=128) and its activations (64 bytes) are single wide loads from the
NVFP4 bytes (the checkpoint's row-major layout, or tiles.py's tile-contiguous one: the same bytes of a
row in 64-byte pieces, ``TILED``), and its e4m3 scales are BK/64 whole 16-element blocks.

L1 interleaves gate and up rows in each 16-row tile (rows 0-7 gate n..n+7, rows 8-15 up
n..n+7), so a thread's accumulator holds gate and up of the same (n, token) and SwiGLU is
computed in registers.

Variants (PREFETCH): 0 loads each K step's tiles at the top of the step and relies on occupancy
to hide latency; 1 loads the next step's weight words before this step's math (one step of
register double buffering); 2 the next step's activations too (1 loads them where they are used, an
L2 hit waited for every step). A cp.async shared-memory ring of 2-4 stages was also tried and was
20-50% slower (bench/moe_kernel_notes.md). ``DecodeConfig.maxnreg`` caps the registers a thread
may use (Triton's ``maxnreg``), so that more programs fit on an SM where the grid has them.

Programmatic dependent launch (``PDL``, sm90): L1 lets L2 launch as soon as every L1 program has
started, and L2 is launched with ``launch_pdl``: its programs take the SM slots L1's last wave frees,
load their first K step's weight words and scales (and the routing, written before L1), and only then
wait (``gdc_wait``) for L1's h; everything L2 writes comes after that wait. L2 in turn lets the top-k
sum launch early (fused_moe._topk_sum waits at its start).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nvfp4stack.kernels.moe.hopper_w4a16._decode_epilogue import (
    _block_tokens,
    _l1_epilogue,
    _l2_epilogue,
    _one_token_sum,
    _one_token_zeros,
    _split_sum,
)
from nvfp4stack.kernels.moe.hopper_w4a16._decode_layouts import decode_layouts

# the PTX dequant (value * 2**-126 bf16 bits) of the Triton kernels, called from Gluon as is
from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import (
    _block_expert,
    _e2m1x4_to_bf16,
    _w_col0,
    _w_cols,
    _w_rows,
)
from nvfp4stack.kernels.moe.hopper_w4a16.decode_buffers import split_workspace, tile_counters

_TWO_POW_118 = gl.constexpr(3.3230699894622794e35)


@gluon.jit
def _to_mma_k(t, ROWS: gl.constexpr, BK: gl.constexpr):
    """[ROWS, BK] in real K order -> [ROWS, BK] in mma K order (see module docstring).

    real k = (BK/4)*q4 + 4*v + 2*d + e  ->  mma k = 16*v + 8*e + 2*q4 + d.
    An mma register pair (mma k, k+1) is then (d = 0, 1): the low nibbles (e = 0) or the high
    nibbles (e = 1) of two neighbouring bytes, which is how _e2m1x4_to_bf16 packs its outputs,
    so the A operand needs no repacking; the activations (B) get one PRMT per register instead.
    """
    t = gl.reshape(t, [ROWS, 4, BK // 16, 2, 2])
    t = gl.permute(t, [0, 2, 4, 1, 3])
    return gl.reshape(t, [ROWS, BK])


@gluon.jit
def _dequant_a(w, sc, MMA: gl.constexpr, W_BLOCKS: gl.constexpr, ROWS: gl.constexpr, BK: gl.constexpr,
               TILED: gl.constexpr):
    """packed [ROWS, BK/2] uint8 + bf16 scales [ROWS, BK/16] -> mma A operand [ROWS, BK] bf16
    (``TILED``: the words in tiles.py's bit order)."""
    w3 = gl.convert_layout(gl.reshape(w, [ROWS, BK // 16, 8]), W_BLOCKS, assert_trivial=True)
    lo, hi = _e2m1x4_to_bf16(w3, TILED)
    s3 = gl.expand_dims(sc, 2)
    lo = lo * s3
    hi = hi * s3
    a = gl.reshape(gl.join(lo, hi), [ROWS, BK])  # real K order
    a = _to_mma_k(a, ROWS, BK)
    return gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))


@gluon.jit
def _x_operand(x, MMA: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr):
    xb = _to_mma_k(x, BT, BK)
    return gl.convert_layout(gl.permute(xb, [1, 0]), gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2))


@gluon.jit
def _scales(sc):
    return (sc.to(gl.float8e4nv, bitcast=True).to(gl.float32) * _TWO_POW_118).to(gl.bfloat16)


@gluon.jit
def _bytes_of(w32, W_BYTES: gl.constexpr, ROWS: gl.constexpr, BK: gl.constexpr):
    """int32 words [ROWS, BK/8] -> their bytes [ROWS, BK/2] (little endian), registers unchanged.

    A loop-carried uint8 tensor is kept as one register per byte and repacked for the PTX
    dequant every step (~1 extra op per weight); carried as words it stays packed.
    """
    b0 = (w32 & 0xFF).to(gl.uint8)
    b1 = ((w32 >> 8) & 0xFF).to(gl.uint8)
    b2 = ((w32 >> 16) & 0xFF).to(gl.uint8)
    b3 = ((w32 >> 24) & 0xFF).to(gl.uint8)
    t = gl.join(gl.join(b0, b2), gl.join(b1, b3))
    return gl.convert_layout(gl.reshape(t, [ROWS, BK // 2]), W_BYTES)


@gluon.jit
def _gemm_rows(
    w_row_ptr,  # [ROWS] pointers (SliceLayout(1, W_BYTES)) to the first packed byte of each row
    s_row_ptr,  # [ROWS] pointers (SliceLayout(1, SliceLayout(2, W_BLOCKS))) to each row's scales
    x_row_ptr,  # [BT] pointers (SliceLayout(1, X_L)) to each token's activation row
    x_mask,  # [BT] valid tokens
    k_lo, k_hi,  # the K columns this CTA sums: [k_lo, k_hi), multiples of BK
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr,
    ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, PREFETCH: gl.constexpr, W32_L: gl.constexpr,
    TILED: gl.constexpr, WAIT: gl.constexpr,  # WAIT: gdc_wait before the first activation load (x: L1's h)
):
    S_L: gl.constexpr = gl.SliceLayout(2, W_BLOCKS)
    offs_wb = _w_cols(gl.arange(0, BK // 2, layout=gl.SliceLayout(0, W_BYTES)), TILED)
    offs_sb = gl.arange(0, BK // 16, layout=gl.SliceLayout(0, S_L))
    offs_xk = gl.arange(0, BK, layout=gl.SliceLayout(0, X_L))
    w_ptrs = gl.expand_dims(w_row_ptr, 1) + gl.expand_dims(offs_wb, 0)
    s_ptrs = gl.expand_dims(s_row_ptr, 1) + gl.expand_dims(offs_sb, 0)
    x_ptrs = gl.expand_dims(x_row_ptr, 1) + gl.expand_dims(offs_xk, 0)
    xm = gl.expand_dims(x_mask, 1)

    acc = gl.zeros([ROWS, BT], gl.float32, layout=MMA)
    if PREFETCH == 0:  # plain loads, latency hidden by occupancy only
        k_first = k_lo
        if WAIT:  # the first step peeled: its weights are loaded before the wait for the activations' writer
            w = gl.load(w_ptrs + _w_col0(k_lo // 2, BK // 2, TILED))
            sc = _scales(gl.load(s_ptrs + k_lo // 16))
            gdc_wait()
            x = gl.load(x_ptrs + k_lo, mask=xm, other=0.0)
            acc = mma_v2(_dequant_a(w, sc, MMA, W_BLOCKS, ROWS, BK, TILED), _x_operand(x, MMA, BT, BK), acc)
            k_first = k_lo + BK
        for k0 in range(k_first, k_hi, BK):
            w = gl.load(w_ptrs + _w_col0(k0 // 2, BK // 2, TILED))
            sc = _scales(gl.load(s_ptrs + k0 // 16))
            x = gl.load(x_ptrs + k0, mask=xm, other=0.0)
            acc = mma_v2(_dequant_a(w, sc, MMA, W_BLOCKS, ROWS, BK, TILED), _x_operand(x, MMA, BT, BK), acc)
    else:  # PREFETCH 1 or 2 (DecodeConfig admits no other): register prefetch, step k+1's words (2: and its
        # activations) are loaded before step k's math
        XA: gl.constexpr = PREFETCH == 2
        W32: gl.constexpr = W32_L[0]
        w32_row = gl.convert_layout(w_row_ptr, gl.SliceLayout(1, W32)).to(gl.pointer_type(gl.int32), bitcast=True)
        w32_ptrs = gl.expand_dims(w32_row, 1) + gl.expand_dims(_w_words(BK, gl.SliceLayout(0, W32), TILED), 0)
        w = gl.load(w32_ptrs + _w_col0(k_lo // 2, BK // 2, TILED) // 4)
        sc = gl.load(s_ptrs + k_lo // 16)
        if WAIT:  # the first step's weights are on their way: now wait for the activations' writer
            gdc_wait()
        if XA:
            x = gl.load(x_ptrs + k_lo, mask=xm, other=0.0)
        for k0 in range(k_lo + BK, k_hi, BK):
            if not XA:
                x = gl.load(x_ptrs + (k0 - BK), mask=xm, other=0.0)  # L2-resident: loaded where it is used
            w_n = gl.load(w32_ptrs + _w_col0(k0 // 2, BK // 2, TILED) // 4)
            sc_n = gl.load(s_ptrs + k0 // 16)
            if XA:
                x_n = gl.load(x_ptrs + k0, mask=xm, other=0.0)
            a = _dequant_a(_bytes_of(w, W_BYTES, ROWS, BK), _scales(sc), MMA, W_BLOCKS, ROWS, BK, TILED)
            acc = mma_v2(a, _x_operand(x, MMA, BT, BK), acc)
            w = w_n
            sc = sc_n
            if XA:
                x = x_n
        if not XA:
            x = gl.load(x_ptrs + (k_hi - BK), mask=xm, other=0.0)
        a = _dequant_a(_bytes_of(w, W_BYTES, ROWS, BK), _scales(sc), MMA, W_BLOCKS, ROWS, BK, TILED)
        acc = mma_v2(a, _x_operand(x, MMA, BT, BK), acc)
    return acc


@gluon.jit
def _k_run(K, BK: gl.constexpr, SPLIT: gl.constexpr):
    """[k_lo, k_hi) of this CTA's run of K steps (grid axis 2), written so that the compiler sees
    k_lo's alignment to BK (the weight loads stay vector loads)."""
    steps = K // BK // SPLIT
    k_lo = gl.program_id(2) * steps * BK
    return k_lo, k_lo + steps * BK


@gluon.jit
def _w_words(BK: gl.constexpr, LAYOUT: gl.constexpr, TILED: gl.constexpr):
    """Offsets of a K step's BK/8 weight words of a row relative to its first word (``_w_cols`` / 4, in
    words so that the compiler keeps each 16-word atom row contiguous: vector copies need it)."""
    c = gl.arange(0, BK // 8, layout=LAYOUT)
    if TILED:
        c = (c // 16) * 1024 + c % 16
    return c


@gluon.jit
def _w_word_step(step, BK: gl.constexpr, TILED: gl.constexpr):
    """Word offset of K step ``step`` (BK columns each) in a weight row, relative to its first word."""
    off = step * (BK // 8)
    if TILED:
        if BK % 128 == 0:
            off = step * (BK // 128 * 1024)
        else:  # BK = 64: half an atom row
            off = (step // 2) * 1024 + (step % 2) * 8
    return off


@gluon.jit
def _l1_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I, H,
                    W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, ROWS: gl.constexpr, TILED: gl.constexpr):
    """Row pointers of an L1 tile: tile row r -> gate row n0 + 8*(r//16) + r%8 (r%16 < 8) or the
    matching up row, so that each accumulator thread holds gate and up of one (n, token); in the
    tiled layout that row is stored as row 2*n0 + r (tiles.l1_row)."""
    S_L: gl.constexpr = gl.SliceLayout(2, W_BLOCKS)
    r_w = gl.arange(0, ROWS, layout=gl.SliceLayout(1, W_BYTES))
    r_s = gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_L))
    wrow_w = n0 + (r_w // 16) * 8 + r_w % 8 + ((r_w // 8) % 2) * I
    wrow_s = n0 + (r_s // 16) * 8 + r_s % 8 + ((r_s // 8) % 2) * I
    if TILED:
        wrow_w = 2 * n0 + r_w
    w_row = w_ptr + expert * stride_we + _w_rows(wrow_w.to(gl.int64), stride_wn, H, TILED)
    s_row = s_ptr + expert * stride_se + wrow_s.to(gl.int64) * stride_sn
    return w_row, s_row


@gluon.jit
def _l2_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I,
                    W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, ROWS: gl.constexpr, TILED: gl.constexpr):
    """Row pointers of an L2 tile: rows n0 .. n0 + ROWS of the expert's w2."""
    S_L: gl.constexpr = gl.SliceLayout(2, W_BLOCKS)
    r_w = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, W_BYTES))
    r_s = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_L))
    w_row = w_ptr + expert * stride_we + _w_rows(r_w.to(gl.int64), stride_wn, I, TILED)
    s_row = s_ptr + expert * stride_se + r_s.to(gl.int64) * stride_sn
    return w_row, s_row


@gluon.jit(do_not_specialize=["num_slots"])
def l1_swiglu_decode_kernel(
    # the operands of _triton_kernels.l1_swiglu_kernel (shapes there), less max_blocks
    x_ptr, stride_xm, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, out_ptr, stride_om,
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, top_k, I, H, limit,
    ws_ptr, cnt_ptr,  # split_k > 1: fp32 [tiles, SPLIT, ROWS * BT] workspace, int32 [tiles] zeroed counts
    HAS_LIMIT: gl.constexpr,
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr,
    ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, PREFETCH: gl.constexpr, W32_L: gl.constexpr,
    TILED: gl.constexpr, SPLIT: gl.constexpr, PDL: gl.constexpr,
):
    # grid: (I // (ROWS/2), token blocks, SPLIT K runs); the fast axis walks n so that neighbours share x
    if PDL:  # L2 may launch once every L1 program has started (it waits for L1's end before reading h)
        gdc_launch_dependents()
    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BT)
    if expert < 0:
        return
    HALF: gl.constexpr = ROWS // 2
    n0 = pid_n * HALF

    # token side (masked: padding slots load zeros)
    offs_t = pid_m * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, X_L))
    tok, valid = _block_tokens(sorted_ids_ptr, offs_t, num_slots, top_k)
    x_row = x_ptr + tok * stride_xm

    w_row, s_row = _l1_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I, H,
                                   W_BYTES, W_BLOCKS, ROWS, TILED)
    k_lo, k_hi = _k_run(H, BK, SPLIT)
    acc = _gemm_rows(w_row, s_row, x_row, valid, k_lo, k_hi, MMA, W_BYTES, W_BLOCKS, X_L, ROWS, BT, BK,
                     PREFETCH, W32_L, TILED, False)
    if SPLIT == 1:
        _l1_epilogue(acc, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit, HAS_LIMIT, MMA, ROWS, BT, 0)
    else:  # the last of the tile's K runs applies the epilogue to their sum
        tot, last = _split_sum(acc, ws_ptr, cnt_ptr, pid_m * gl.num_programs(0) + pid_n, sorted_ids_ptr, num_slots,
                               pid_m, MMA, ROWS, BT, SPLIT)
        if last:
            _l1_epilogue(tot, gs_ptr, expert, out_ptr, stride_om, n0, pid_m, limit, HAS_LIMIT, MMA, ROWS, BT, 0)


@gluon.jit(do_not_specialize=["num_slots"])
def l2_decode_kernel(
    # the operands of _triton_kernels.l2_combine_kernel (shapes there), less max_blocks
    a_ptr, stride_am, w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, gs_ptr, topk_w_ptr,
    out_ptr, stride_om, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, num_slots, H, I,
    stride_os,  # split_k > 1: out is fp32 [SPLIT, slots, H] partials (the top-k sum adds them), this dim's stride
    sum_ptr, sum_cnt_ptr, top_k,  # FUSE_SUM (one token): its output [1, H], int32 zeroed counts per n-tile
    MMA: gl.constexpr, W_BYTES: gl.constexpr, W_BLOCKS: gl.constexpr, X_L: gl.constexpr,
    ROWS: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, PREFETCH: gl.constexpr, W32_L: gl.constexpr,
    TILED: gl.constexpr, SPLIT: gl.constexpr, FUSE_SUM: gl.constexpr,
    PDL: gl.constexpr,  # launched with launch_pdl: wait for L1 (gdc_wait) before reading h or writing anything
):
    # grid: (H // ROWS, token blocks, SPLIT K runs)
    if PDL:  # the top-k sum may launch once every L2 program has started (it waits for L2's end)
        gdc_launch_dependents()
    pid_n, pid_m = gl.program_id(0), gl.program_id(1)
    n0 = pid_n * ROWS
    # the routing was written before L1 started: readable before the wait
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BT)
    if expert < 0:
        if FUSE_SUM:
            if PDL:
                gdc_wait()
            _one_token_zeros(expert_ids_ptr, top_k, sum_ptr, n0, pid_m, MMA, ROWS)
        return

    offs_t = pid_m * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, X_L))
    # L1 wrote every row of this block (padding rows too): no token mask needed
    a_row = a_ptr + offs_t.to(gl.int64) * stride_am
    w_row, s_row = _l2_weight_rows(w_ptr, stride_we, stride_wn, s_ptr, stride_se, stride_sn, expert, n0, I,
                                   W_BYTES, W_BLOCKS, ROWS, TILED)
    k_lo, k_hi = _k_run(I, BK, SPLIT)
    acc = _gemm_rows(w_row, s_row, a_row, offs_t >= 0, k_lo, k_hi, MMA, W_BYTES, W_BLOCKS, X_L, ROWS, BT, BK,
                     PREFETCH, W32_L, TILED, PDL)
    _l2_epilogue(acc, gs_ptr, expert, topk_w_ptr, out_ptr, stride_om, stride_os, sorted_ids_ptr, num_slots, n0,
                 pid_m, MMA, ROWS, BT, SPLIT)
    if FUSE_SUM:  # the top-k sum here, not in its own launch
        _one_token_sum(out_ptr, stride_om, stride_os, expert_ids_ptr, top_k, sum_ptr, sum_cnt_ptr, pid_n, n0, MMA,
                       ROWS, SPLIT)


def launch(cfg1, cfg2, l1_args: tuple, l2_args: tuple, nblocks: int, inter: int, hidden: int,
           limit: float, has_limit: bool, tiled: bool, rows_split_stride: int = 0, fused_sum=None,
           pdl: bool = False) -> None:
    """Both GEMMs on (L1, L2) DecodeConfig tiles; args as fused_moe.nvfp4_moe_forward_triton builds them
    (``tiled``: the weights in tiles.py's layout; ``rows_split_stride``: the first-dim stride of the top-k
    rows' fp32 partials where L2's split_k is over 1; ``fused_sum``: (out [1, H], top_k) where the routing
    is one token's (routing.one_token_routing), whose top-k sum L2 then does itself; ``pdl``: L2 by
    programmatic dependent launch, see the module docstring)."""
    def layouts(c) -> dict:
        mma, w_bytes, w_blocks, x_l, extra = decode_layouts(c.num_warps, c.mrep, c.block_t, c.block_k, c.prefetch)
        return dict(MMA=mma, W_BYTES=w_bytes, W_BLOCKS=w_blocks, X_L=x_l, ROWS=c.rows, BT=c.block_t,
                    BK=c.block_k, PREFETCH=c.prefetch, W32_L=extra, TILED=tiled, SPLIT=c.split_k,
                    num_warps=c.num_warps, **({"maxnreg": c.maxnreg} if c.maxnreg else {}))

    n_tiles = inter // (cfg1.rows // 2)
    ws, counts = split_workspace(cfg1, n_tiles * nblocks, l1_args[0].device)
    l1_swiglu_decode_kernel[(n_tiles, nblocks, cfg1.split_k)](
        *l1_args, limit, ws, counts, HAS_LIMIT=has_limit, PDL=pdl, **layouts(cfg1))
    out, top_k = fused_sum or (counts, 0)
    sum_counts = tile_counters(hidden // cfg2.rows, out.device, "the one-token top-k sum", cfg2) if fused_sum \
        else counts
    l2_decode_kernel[(hidden // cfg2.rows, nblocks, cfg2.split_k)](
        *l2_args, rows_split_stride, out, sum_counts, top_k, FUSE_SUM=fused_sum is not None, PDL=pdl,
        launch_pdl=pdl, **layouts(cfg2))
