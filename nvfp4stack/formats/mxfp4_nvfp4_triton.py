"""Fused CUDA path of MXFP4 -> NVFP4 scales (Triton; imported only when a CUDA tensor needs it).

Same function as the torch path in ``nvfp4stack.convert.mxfp4_to_nvfp4`` for the case where
every block is exact: E2M1 bytes carry over untouched, so the work is two passes over the
scales, one of which reads the packed data once to find the blocks with a nonzero code.
  pass 1: top[e] = max UE8M0 exponent over the 16-blocks with any nonzero magnitude (atomic max)
  pass 2: E4M3 byte of 2^clamp(s - g, -9, 8) for both 16-halves of each 32-block, and the count
          of inexact blocks (s - g < -9 and nonzero); the data is read only for those blocks.
The caller falls back to the torch path when that count is nonzero (rare: needs > 17 binades).
Runs on CPU tensors too under TRITON_INTERPRET=1, which is how CI checks it against torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_MAG = 0x7777777777777777  # magnitude bits of the 16 nibbles of one int64 word (one 16-block)
_EMPTY = -(1 << 20)        # "no nonzero block" marker, below any UE8M0 exponent
_BLOCK = 1024              # 32-blocks per program: 16 KiB of packed data


@triton.jit
def _top_kernel(words_ptr, scale_ptr, top_ptr, per_expert, BLOCK: tl.constexpr):
    e = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < per_expert
    gi = e * per_expert + offs                                          # global 32-block index
    w = tl.load(words_ptr + (2 * gi)[:, None] + tl.arange(0, 2)[None, :], mask=valid[:, None], other=0)
    s = tl.load(scale_ptr + gi, mask=valid, other=0).to(tl.int32) - 127
    cand = tl.where((w & _MAG) != 0, s[:, None], _EMPTY)
    tl.atomic_max(top_ptr + e, tl.max(tl.max(cand, axis=1), axis=0))


@triton.jit
def _scale_kernel(words_ptr, scale_ptr, g_ptr, out_ptr, inexact_ptr, per_expert, BLOCK: tl.constexpr):
    e = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < per_expert
    gi = e * per_expert + offs
    s = tl.load(scale_ptr + gi, mask=valid, other=0).to(tl.int32) - 127
    k = s - tl.load(g_ptr + e)
    kc = tl.minimum(tl.maximum(k, -9), 8)
    # E4M3 bits of 2^kc: normal (biased exponent kc+7, zero mantissa) down to 2^-6, below that
    # the subnormals 2^-7..2^-9 are mantissa 4, 2, 1 with a zero exponent field
    byte = tl.where(kc >= -6, (kc + 7) << 3, 1 << tl.maximum(kc + 9, 0)).to(tl.uint8)
    two = tl.arange(0, 2)[None, :]
    tl.store(out_ptr + (2 * gi)[:, None] + two, tl.broadcast_to(byte[:, None], (BLOCK, 2)),
             mask=valid[:, None])
    low = valid & (k < -9)
    w = tl.load(words_ptr + (2 * gi)[:, None] + two, mask=low[:, None], other=0)
    n = tl.sum(tl.sum(((w & _MAG) != 0).to(tl.int32), axis=1), axis=0)
    tl.atomic_add(inexact_ptr, n)


def run_top(data: torch.Tensor, scale: torch.Tensor, experts: int) -> torch.Tensor:
    """int32 [experts]: max exponent over nonzero 16-blocks, ``_EMPTY`` if there is none."""
    per_expert = scale.numel() // experts
    top = torch.full((experts,), _EMPTY, dtype=torch.int32, device=scale.device)
    grid = (triton.cdiv(per_expert, _BLOCK), experts)
    _top_kernel[grid](data.view(torch.int64), scale, top, per_expert, BLOCK=_BLOCK)
    return top


def run_scales(data: torch.Tensor, scale: torch.Tensor, g: torch.Tensor):
    """(uint8 E4M3 bytes with twice ``scale``'s last dim, int32 [1] inexact-block count)."""
    experts = g.numel()
    per_expert = scale.numel() // experts
    out = torch.empty((*scale.shape[:-1], scale.shape[-1] * 2), dtype=torch.uint8, device=scale.device)
    inexact = torch.zeros(1, dtype=torch.int32, device=scale.device)
    grid = (triton.cdiv(per_expert, _BLOCK), experts)
    _scale_kernel[grid](data.view(torch.int64), scale, g.to(torch.int32).reshape(-1).contiguous(), out,
                        inexact, per_expert, BLOCK=_BLOCK)
    return out, inexact
