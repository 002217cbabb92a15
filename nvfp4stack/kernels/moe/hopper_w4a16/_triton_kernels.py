"""Triton sources of the NVFP4 weight-only (W4A16) fused MoE: imported lazily, GPU hosts only.

Both kernels walk blocks of ``BM`` routed slots that belong to one expert (routing.py) and
dequantize the packed E2M1 weights in registers, one [BN, BK] tile at a time; bf16 weights are
never written to memory. The per-expert global scale is applied once in the epilogue.
Variants measured and dropped (even/odd K split, per-byte scale gather, swapped MMA operands,
bf16x2 scale multiply in PTX): bench/moe_kernel_notes.md.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

# The tiles carry value * scale * 2**-8 (see _dequant_tile); the epilogue multiplies it back.
_TILE_UNSCALE = tl.constexpr(256.0)
_TWO_POW_118 = tl.constexpr(3.3230699894622794e35)
# Integer arguments that change with every batch size. Triton would otherwise compile one binary
# per (== 1, % 16 == 0, other) class of each, and a server would meet the new ones mid-request
# (1.6-2.1 s stalls on an H200, bench/RESULTS.md); with these unspecialized, each tile config has
# one binary, which warmup.py compiles at load.
_PER_CALL = ["num_slots", "max_blocks"]


@triton.jit
def _grouped_pid(BM: tl.constexpr, BN: tl.constexpr, N, max_blocks, GROUP_M: tl.constexpr):
    # Neighbouring programs share a weight tile (same n, next m blocks of one expert): keep
    # GROUP_M m-blocks together so that tile is read from HBM once and hit in L2 after.
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_pid_n
    group_id = pid // in_group
    first_m = group_id * GROUP_M
    group_size = tl.minimum(max_blocks - first_m, GROUP_M)
    pid_m = first_m + ((pid % in_group) % group_size)
    pid_n = (pid % in_group) // group_size
    return pid_m, pid_n


@triton.jit
def _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BM: tl.constexpr):
    """Expert of routing block ``pid_m`` (int64), or -1 where the block lies past num_padded or
    holds no routed slot: the kernel then returns. Shared by the Triton and the Gluon kernels."""
    live = pid_m * BM < tl.load(num_padded_ptr)
    return tl.load(expert_ids_ptr + pid_m, mask=live, other=-1).to(tl.int64)


@triton.jit
def _w_rows(t, stride_wn, K, TILED: tl.constexpr):
    """Byte offset within one expert of weight storage row ``t`` (int64, K codes per row): ``t * stride_wn``
    row-major, else its 64-row atom block and its place in the atom (tiles.py; ``t`` counts rows in
    the tiled order, for w13 tiles.l1_row's). Shared by the Triton and the Gluon kernels."""
    off = t * stride_wn
    if TILED:
        off = (t // 64) * (32 * K) + (t % 64) * 64
    return off


@triton.jit
def _w_cols(kb, TILED: tl.constexpr):
    """Byte offset of byte ``kb`` of a weight row relative to the row's first byte: ``kb`` row-major,
    else its 64-byte atom (4096 bytes apart along K) plus its place in it (tiles.py).
    _w_cols(a + o) == _w_cols(a) + _w_cols(o) wherever a % 64 + o < 64 or a % 64 == 0, so a K step's
    offset and the offsets within the step add."""
    off = kb
    if TILED:
        off = (kb // 64) * 4096 + kb % 64
    return off


@triton.jit
def _w_col0(kb, STEP: tl.constexpr, TILED: tl.constexpr):
    """``_w_cols(kb)`` for the first byte ``kb`` of a K step of STEP bytes (kb a multiple of STEP, STEP a
    multiple of 32), written so that the compiler sees its alignment (without it, vector loads split
    into byte loads)."""
    off = kb
    if TILED:
        if STEP % 64 == 0:
            off = (kb // 64) * 4096
        else:
            off = (kb // 64) * 4096 + ((kb // 32) % 2) * 32
    return off


@triton.jit
def _w_step(k0, BK: tl.constexpr, TILED: tl.constexpr):
    """What a weight pointer at K column k0 (a multiple of BK) adds to reach column k0 + BK."""
    step = BK // 2
    if TILED:
        if BK % 128 == 0:
            step = (BK // 128) * 4096
        else:  # BK = 64: the second half of an atom, or the next atom's start
            step = tl.where((k0 // 64) % 2 == 1, 4096 - 32, 32)
    return step


@triton.jit
def _l1_storage_rows(n, I, TILED: tl.constexpr):
    """(gate, up) storage rows of w13 for intermediate columns ``n`` (int64): n and I + n row-major,
    else tiles.l1_storage_row's (8 gate then the same 8 up rows in each 16)."""
    gate = n
    up = n + I
    if TILED:
        gate = (n // 8) * 16 + n % 8
        up = gate + 8
    return gate, up


# the row-major bytes' PTX: a byte reorder, then per output two shifts, two masks and an or
_PTX_ROWS = tl.constexpr("""
        {
        .reg .b32 w, v, t;
        prmt.b32 w, $4, 0, 0x3120;
        shl.b32 v, w, 12;
        shr.b32 t, v, 6; and.b32 t, t, 0x01C001C0; and.b32 v, v, 0x80008000; or.b32 $0, v, t;
        shl.b32 v, w, 4;
        shr.b32 t, v, 6; and.b32 t, t, 0x01C001C0; and.b32 v, v, 0x80008000; or.b32 $1, v, t;
        shl.b32 v, w, 8;
        shr.b32 t, v, 6; and.b32 t, t, 0x01C001C0; and.b32 v, v, 0x80008000; or.b32 $2, v, t;
        shr.b32 t, w, 6; and.b32 t, t, 0x01C001C0; and.b32 v, w, 0x80008000; or.b32 $3, v, t;
        }
        """)
# the tile layout's words (tiles.PAIR_BITS): pair 0 one mask; pairs 1, 2 a multiply by 8 / 64 (shifts on the FMA
# pipe) and a mask; pair 3 a shift right by 7, a pre-mask, a multiply by 1 + 2**5 + 2**11 (three copies of the
# pre-masked bits that do not overlap: no carries) and a mask
_PTX_TILED = tl.constexpr("""
        {
        .reg .b32 t;
        and.b32 $0, $4, 0x81C081C0;
        mul.lo.u32 t, $4, 8; and.b32 $1, t, 0x81C081C0;
        mul.lo.u32 t, $4, 64; and.b32 $2, t, 0x81C081C0;
        shr.b32 t, $4, 7; and.b32 t, t, 0x00D800D8; mul.lo.u32 t, t, 2081; and.b32 $3, t, 0x81C081C0;
        }
        """)


@triton.jit
def _e2m1x4_to_bf16(packed, TILED: tl.constexpr):
    """uint8 [..] -> (even-k, odd-k) bf16 [..]: each nibble's bf16 bits, value * 2**-126.

    Four bytes per 32-bit register, two bf16 per output register: the bytes are reordered
    (prmt) so that one shift puts two wanted nibbles at the top of both 16-bit halves, then
    sign (bit 15) and exponent|mantissa (bits 12..14 -> 6..8) are masked into place. About
    2.5 integer ops per weight against ~8 for the per-element form (DEQ=1): decode is bound
    by this ALU work, and the change took decode at the bench "pro" shape (H 7168, I 3072)
    from 1.13 ms to 0.69 ms on an H200.
    The Gluon decode kernels (_decode_gluon.py) call this function as is.

    TILED: the bytes in tiles.py's layout, whose words hold their bits where _PTX_TILED reads them:
    same outputs in 6 integer-pipe ops per word and 3 multiplies on the FMA pipe, against ~13
    integer-pipe ops (the pipe that bound the decode loops; bench/moe_kernel_notes_history.md, fourteenth
    pass). The 4 bytes of one packed register must then be one stored word, in order, which holds
    wherever 4 consecutive bytes of a row sit in one thread's registers (every kernel here).
    """
    return tl.inline_asm_elementwise(
        asm=_PTX_TILED if TILED else _PTX_ROWS,
        constraints="=r,=r,=r,=r,r",
        args=[packed],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _dequant_tile(w_ptrs, s_ptrs, mask_n, BN: tl.constexpr, BK: tl.constexpr, DEQ: tl.constexpr,
                  TILED: tl.constexpr):
    """[BN, BK/2] packed bytes + [BN, BK/16] e4m3 scales -> [BN, BK] bf16 = value * scale * 2**-8.

    E2M1 codes become bf16 bits directly (bits 6..8 exp|mantissa, 15 sign: value * 2**-126,
    code 1 a bf16 subnormal); one bf16 multiply by scale * 2**118 (which fits bf16) restores the
    magnitude up to 2**-8. e2m1 (2 significant bits) times e4m3 (4 bits) is exact in bf16, so
    the tile equals the fp32 dequantization up to the global scale and that power of two.
    DEQ=2: bit placement in PTX on packed registers; DEQ=1: the same in per-element Triton ops
    (portable fallback, ~1.6x slower at decode); DEQ=9: diagnostic only, WRONG numbers (same
    loads and MMAs, no dequant work) to measure the floor of this kernel structure.
    TILED: the bytes in tiles.py's layout (DEQ=2 only: the per-element form does not read its words).
    """
    tl.static_assert(DEQ != 1 or not TILED, "DEQ=1 reads row-major bytes only")
    packed = tl.load(w_ptrs, mask=mask_n[:, None], other=0)  # [BN, BK/2] uint8
    sc = tl.load(s_ptrs, mask=mask_n[:, None], other=0)  # [BN, BK/16] uint8 (e4m3 bits)
    sc = (sc.to(tl.float8e4nv, bitcast=True).to(tl.float32) * _TWO_POW_118).to(tl.bfloat16)
    # each scale covers 16 elements = 8 packed bytes
    sc = tl.reshape(tl.broadcast_to(sc[:, :, None], (BN, BK // 16, 8)), (BN, BK // 2))
    if DEQ == 2:
        lo_b, hi_b = _e2m1x4_to_bf16(packed, TILED)
    elif DEQ == 9:
        lo_b = packed.to(tl.bfloat16)
        hi_b = lo_b
    else:
        lo = packed & 0xF
        hi = packed >> 4
        lo_b = (((lo & 0x8).to(tl.uint16) << 12) | ((lo & 0x7).to(tl.uint16) << 6)).to(
            tl.bfloat16, bitcast=True
        )
        hi_b = (((hi & 0x8).to(tl.uint16) << 12) | ((hi & 0x7).to(tl.uint16) << 6)).to(
            tl.bfloat16, bitcast=True
        )
    if DEQ != 9:
        lo_b = lo_b * sc
        hi_b = hi_b * sc
    # even element sits in the low nibble: interleave (lo, hi) along K
    return tl.reshape(tl.join(lo_b, hi_b), (BN, BK))


@triton.jit(do_not_specialize=_PER_CALL)
def l1_swiglu_kernel(
    x_ptr, stride_xm,  # [T, H] bf16
    w_ptr, stride_we, stride_wn,  # [E, 2I, H/2] uint8 (TILED: in tiles.py's layout, stride_wn unused)
    s_ptr, stride_se, stride_sn,  # [E, 2I, H/16] uint8
    gs_ptr,  # [E] fp32
    out_ptr, stride_om,  # [max_padded, I] bf16, rows in sorted-slot order
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_slots, top_k, I, H, max_blocks, limit,
    HAS_LIMIT: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    DEQ: tl.constexpr, TILED: tl.constexpr = False,
):
    pid_m, pid_n = _grouped_pid(BM, BN, I, max_blocks, GROUP_M)
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BM)
    if expert < 0:
        return
    offs_m = pid_m * BM + tl.arange(0, BM)
    slot = tl.load(sorted_ids_ptr + offs_m)
    valid_m = slot < num_slots
    tok = (slot // top_k).to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask_n = offs_n < I
    offs_k = tl.arange(0, BK)
    offs_kp = tl.arange(0, BK // 2)
    offs_ks = tl.arange(0, BK // 16)

    x_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
    w_base = w_ptr + expert * stride_we
    s_base = s_ptr + expert * stride_se
    t_gate, t_up = _l1_storage_rows(offs_n.to(tl.int64), I, TILED)
    wg_ptrs = w_base + _w_rows(t_gate, stride_wn, H, TILED)[:, None] + _w_cols(offs_kp, TILED)[None, :]
    wu_ptrs = w_base + _w_rows(t_up, stride_wn, H, TILED)[:, None] + _w_cols(offs_kp, TILED)[None, :]
    sg_ptrs = s_base + offs_n[:, None].to(tl.int64) * stride_sn + offs_ks[None, :]
    su_ptrs = s_base + (offs_n[:, None] + I).to(tl.int64) * stride_sn + offs_ks[None, :]

    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, H, BK):
        x = tl.load(x_ptrs, mask=valid_m[:, None], other=0.0)
        acc_g = tl.dot(x, tl.trans(_dequant_tile(wg_ptrs, sg_ptrs, mask_n, BN, BK, DEQ, TILED)), acc_g)
        acc_u = tl.dot(x, tl.trans(_dequant_tile(wu_ptrs, su_ptrs, mask_n, BN, BK, DEQ, TILED)), acc_u)
        x_ptrs += BK
        wg_ptrs += _w_step(k0, BK, TILED)
        wu_ptrs += _w_step(k0, BK, TILED)
        sg_ptrs += BK // 16
        su_ptrs += BK // 16

    # w1 and w3 share one global scale (modelopt export)
    gs = tl.load(gs_ptr + expert) * _TILE_UNSCALE
    gate = acc_g * gs
    up = acc_u * gs
    if HAS_LIMIT:
        # clamped SwiGLU (swiglu_limit, as torch_twin.clamped_swiglu): gate <= limit, |up| <= limit
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    h = gate * tl.sigmoid(gate) * up
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=mask_n[None, :])


@triton.jit(do_not_specialize=_PER_CALL)
def l2_combine_kernel(
    a_ptr, stride_am,  # [max_padded, I] bf16 from l1_swiglu_kernel
    w_ptr, stride_we, stride_wn,  # [E, H, I/2] uint8 (TILED: in tiles.py's layout, stride_wn unused)
    s_ptr, stride_se, stride_sn,  # [E, H, I/16] uint8
    gs_ptr,  # [E] fp32
    topk_w_ptr,  # [T*k] fp32
    out_ptr, stride_om,  # [T*k, H] bf16, one row per routed slot
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
    num_slots, H, I, max_blocks,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    DEQ: tl.constexpr, TILED: tl.constexpr = False,
):
    pid_m, pid_n = _grouped_pid(BM, BN, H, max_blocks, GROUP_M)
    expert = _block_expert(expert_ids_ptr, num_padded_ptr, pid_m, BM)
    if expert < 0:
        return
    offs_m = pid_m * BM + tl.arange(0, BM)
    slot = tl.load(sorted_ids_ptr + offs_m)
    valid_m = slot < num_slots
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask_n = offs_n < H
    offs_k = tl.arange(0, BK)
    offs_kp = tl.arange(0, BK // 2)
    offs_ks = tl.arange(0, BK // 16)

    # L1 wrote every row of this block (padding rows are zeros): no row mask needed
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = (w_ptr + expert * stride_we + _w_rows(offs_n.to(tl.int64), stride_wn, I, TILED)[:, None]
              + _w_cols(offs_kp, TILED)[None, :])
    s_ptrs = s_ptr + expert * stride_se + offs_n[:, None].to(tl.int64) * stride_sn + offs_ks[None, :]

    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, I, BK):
        a = tl.load(a_ptrs)
        acc = tl.dot(a, tl.trans(_dequant_tile(w_ptrs, s_ptrs, mask_n, BN, BK, DEQ, TILED)), acc)
        a_ptrs += BK
        w_ptrs += _w_step(k0, BK, TILED)
        s_ptrs += BK // 16

    gs = tl.load(gs_ptr + expert) * _TILE_UNSCALE
    route_w = tl.load(topk_w_ptr + slot, mask=valid_m, other=0.0)
    y = acc * gs * route_w[:, None]
    out_ptrs = out_ptr + slot[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=valid_m[:, None] & mask_n[None, :])


@triton.jit
def topk_sum_kernel(rows_ptr, ids_ptr, out_ptr, H, stride_rs, TOP_K: tl.constexpr, SPLIT: tl.constexpr,
                    BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[t, :] = sum_j sum_s rows[s, t*TOP_K + j, :] in fp32, cast once: the top-k combine in one launch
    (the torch form, sum(dtype=fp32) then .to(), is two); SPLIT > 1: the L2 runs' partials (split_k).
    Slots whose expert id is negative (another rank's expert) were computed by no block: their rows are
    skipped, not read. PDL: launched with launch_pdl after the Gluon decode L2 (sm90), so it first waits for
    L2's end."""
    if PDL:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        mine = m & (tl.load(ids_ptr + t * TOP_K + j) >= 0)
        row = rows_ptr + (t * TOP_K + j) * H + offs
        for s in tl.static_range(SPLIT):
            if s > 0:  # int64: (SPLIT - 1) x slots x H may pass 2**31
                row += stride_rs.to(tl.int64)
            acc += tl.load(row, mask=mine, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + offs, acc.to(out_ptr.dtype.element_ty), mask=m)
