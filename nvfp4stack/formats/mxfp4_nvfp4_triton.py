"""Fused CUDA path of MXFP4 -> NVFP4 scales (Triton; imported only when a CUDA tensor needs it).

Same function as the torch path in ``nvfp4stack.convert.mxfp4_to_nvfp4`` for the case where
every block is exact: E2M1 bytes carry over untouched, so the work is two passes over the
scales, one of which reads the packed data once to find the blocks with a nonzero code.
  pass 1: top[e] = max UE8M0 exponent over the 16-blocks with any nonzero magnitude (atomic max)
  pass 2: g[e] from top[e], E4M3 byte of 2^clamp(s - g, -9, 8) for both 16-halves of each
          32-block, the fp32 global scale 2^g, and the count of inexact blocks (s - g < -9 and
          nonzero); the data is read only for those blocks.
Three launches and one host sync in all: at 0.5 byte per parameter the launches, not the bytes,
are what a per-op torch version spends its time on. The caller falls back to the torch path
when the count is nonzero (rare: needs > 17 binades). Runs on CPU tensors too under
TRITON_INTERPRET=1, which is how CI checks it against torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAG = tl.constexpr(0x7777777777777777)  # magnitude bits of the 16 nibbles of one int64 word
_EMPTY = -(1 << 20)                      # "no nonzero block" marker, below any UE8M0 exponent
_EMPTY_C = tl.constexpr(_EMPTY)          # jit code reads globals only as constexpr
_BLOCK = 1024                            # 32-blocks per program: 16 KiB of packed data


@triton.jit
def _top_kernel(words_ptr, scale_ptr, ws_ptr, per_expert, BLOCK: tl.constexpr):
    e = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < per_expert
    gi = e * per_expert + offs                                          # global 32-block index
    w = tl.load(words_ptr + (2 * gi)[:, None] + tl.arange(0, 2)[None, :], mask=valid[:, None], other=0)
    s = tl.load(scale_ptr + gi, mask=valid, other=0).to(tl.int32) - 127
    cand = tl.where((w & _MAG) != 0, s[:, None], _EMPTY_C)
    tl.atomic_max(ws_ptr + e, tl.max(tl.max(cand, axis=1), axis=0))


@triton.jit
def _scale_kernel(words_ptr, scale_ptr, ws_ptr, out_ptr, gs_ptr, experts, per_expert,
                  K_MIN: tl.constexpr, K_MAX: tl.constexpr, BIAS: tl.constexpr, BLOCK: tl.constexpr):
    e = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < per_expert
    gi = e * per_expert + offs
    # the torch path's _global_exponent: an all-zero expert puts g at 0, else the top block on
    # 2^K_MAX, and g stays a normal fp32 exponent (>= -126)
    top = tl.load(ws_ptr + e)
    g = tl.maximum(tl.where(top < -BIAS, K_MAX, top) - K_MAX, -126)
    if tl.program_id(0) == 0:  # fp32 2^g built from its bits: exact, no exp2 approximation
        tl.store(gs_ptr + e, ((g + 127) << 23).to(tl.float32, bitcast=True))
    s = tl.load(scale_ptr + gi, mask=valid, other=0).to(tl.int32) - BIAS
    k = s - g
    kc = tl.minimum(tl.maximum(k, K_MIN), K_MAX)
    # E4M3 bits of 2^kc: normal (biased exponent kc+7, zero mantissa) down to 2^-6, below that
    # the subnormals 2^-7..2^-9 are mantissa 4, 2, 1 with a zero exponent field
    byte = tl.where(kc >= -6, (kc + 7) << 3, 1 << tl.maximum(kc + 9, 0)).to(tl.uint8)
    two = tl.arange(0, 2)[None, :]
    tl.store(out_ptr + (2 * gi)[:, None] + two, tl.broadcast_to(byte[:, None], (BLOCK, 2)),
             mask=valid[:, None])
    low = valid & (k < K_MIN)
    w = tl.load(words_ptr + (2 * gi)[:, None] + two, mask=low[:, None], other=0)
    n = tl.sum(tl.sum(((w & _MAG) != 0).to(tl.int32), axis=1), axis=0)
    tl.atomic_add(ws_ptr + experts, n)


def convert_scales(data: torch.Tensor, scale: torch.Tensor, experts: int, k_min: int, k_max: int,
                   bias: int, top: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """data uint8 [..., K/2], scale uint8 [..., K/32] (contiguous, rows split evenly over
    ``experts``) -> (E4M3 bytes uint8 [..., K/16], fp32 global scales [experts], number of
    inexact 16-blocks). ``top``: given int32 top exponents [experts] instead of pass 1's."""
    per_expert = scale.numel() // experts
    # one workspace, one fill: top[e] per expert, then the inexact counter, which therefore
    # starts at _EMPTY instead of 0 (subtracted below)
    ws = torch.full((experts + 1,), _EMPTY, dtype=torch.int32, device=scale.device)
    out = torch.empty((*scale.shape[:-1], scale.shape[-1] * 2), dtype=torch.uint8, device=scale.device)
    gs = torch.empty((experts,), dtype=torch.float32, device=scale.device)
    words = data.view(torch.int64)
    grid = (triton.cdiv(per_expert, _BLOCK), experts)
    if top is None:
        _top_kernel[grid](words, scale, ws, per_expert, BLOCK=_BLOCK)
    else:
        ws[:experts] = top.reshape(-1)
    _scale_kernel[grid](words, scale, ws, out, gs, experts, per_expert,
                        K_MIN=k_min, K_MAX=k_max, BIAS=bias, BLOCK=_BLOCK)
    return out, gs, int(ws[experts]) - _EMPTY
