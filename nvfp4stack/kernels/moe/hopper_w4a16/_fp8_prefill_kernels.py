"""Triton sources of the FP8 prefill mode's elementwise stages: imported lazily, GPU hosts only.

The first device run did these stages with torch ops and spent ~60% of the time there (Pro,
4096 tok/expert: 44.6 ms, 17 ms of it FP8 GEMM at ~1000 TFLOP/s): each op made one more pass over
[rows, H] in fp32. Here each stage is one pass, one program per row (or per token), fp32 in
registers. The numbers are those of the torch reference functions in fp8_prefill.py (the
quantizer bit for bit: same fp32 reciprocal-then-multiply, round to nearest even).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _quant_row(v, mask, q_ptr, s_ptr, row, stride_q, offs, AMAX_FLOOR: tl.constexpr, FP8_MAX: tl.constexpr):
    amax = tl.max(tl.where(mask, tl.abs(v), 0.0), axis=0)
    sf = tl.math.div_rn(tl.maximum(amax, AMAX_FLOOR), FP8_MAX)
    inv = tl.math.div_rn(1.0, sf)  # torch computes 1/sf exactly rounded, then multiplies
    tl.store(q_ptr + row * stride_q + offs, (v * inv).to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + row, sf)


@triton.jit(do_not_specialize=["num_tokens"])  # one binary for every token count
def gather_quant_rows_kernel(
    x_ptr, stride_x, tok_ptr, num_tokens, q_ptr, stride_q, s_ptr, K,
    AMAX_FLOOR: tl.constexpr, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr,
):
    """q[r] = e4m3(x[tok[r]] / s[r]), s[r] = max(amax, floor) / 448; tok >= T is a zero row."""
    row = tl.program_id(0)
    tok = tl.load(tok_ptr + row)
    offs = tl.arange(0, BLOCK)
    mask = offs < K
    v = tl.load(x_ptr + tok.to(tl.int64) * stride_x + offs, mask=mask & (tok < num_tokens), other=0.0)
    _quant_row(v.to(tl.float32), mask, q_ptr, s_ptr, row.to(tl.int64), stride_q, offs, AMAX_FLOOR, FP8_MAX)


@triton.jit
def swiglu_quant_rows_kernel(
    h_ptr, stride_h, q_ptr, stride_q, s_ptr, I, limit,
    HAS_LIMIT: tl.constexpr, AMAX_FLOOR: tl.constexpr, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr,
):
    """Row r of h [P, 2I] (gate | up) -> e4m3 of the clamped silu(gate) * up (swiglu_limit), in fp32."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < I
    gate = tl.load(h_ptr + row * stride_h + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + row * stride_h + I + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    act = gate / (1.0 + tl.exp(-gate)) * up
    _quant_row(act, mask, q_ptr, s_ptr, row, stride_q, offs, AMAX_FLOOR, FP8_MAX)


@triton.jit
def combine_topk_kernel(
    y_ptr, stride_y, pos_ptr, w_ptr, out_ptr, stride_out, H,
    TOP_K: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[t] = sum_j w[t, j] * y[pos[t, j]] in fp32 (pos: padded row of slot t*k + j; -1: in no
    block, another rank's expert, skipped)."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pos = tl.load(pos_ptr + t * TOP_K + j).to(tl.int64)
        w = tl.load(w_ptr + t * TOP_K + j)
        acc += w * tl.load(y_ptr + pos * stride_y + offs, mask=mask & (pos >= 0), other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_out + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
