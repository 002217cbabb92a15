"""``k_order.permute_k`` as one Triton launch (GPU; the Triton interpreter on CPU in CI).

The wgmma decode kernels stage the activations verbatim, so the forward hands them a K-permuted copy of x
(k_order.py). torch's strided copy of that 6-dimensional view is an element-wise TensorIterator kernel with index
arithmetic per 2-byte element. Here each program writes ``BLOCK`` consecutive output elements (16-byte stores) and
gathers them from the real columns, which lie within the same ``block_k`` columns of one row (L1-cached loads).
Same bytes, bit for bit: a permutation. Alone on an H200 it is 1.09-1.27x torch's copy at 8-512 tokens (3.24 against
2.79 us at 128; bench/tools/permute_k_ab.py); in the engine both run beside vLLM's shared expert on its second
stream and take about 12 us there, so no gain in the engine is claimed (bench/RESULTS.md, fifteenth visit).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvfp4stack.kernels.moe.hopper_w4a16.k_order import check_block

BLOCK = 2048


@triton.jit
def _permute_k_kernel(x_ptr, out_ptr, n, K, stride_x, BK: tl.constexpr, BLOCK: tl.constexpr):
    j = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = j < n
    t = j // K
    c = j % K
    r = c % BK
    # stored position r = 16*v + 8*e + 2*q4 + d  <-  real column (BK/4)*q4 + 4*v + 2*d + e
    v, e, q4, d = r // 16, (r // 8) % 2, (r // 2) % 4, r % 2
    src = (c - r) + q4 * (BK // 4) + 4 * v + 2 * d + e
    tl.store(out_ptr + j, tl.load(x_ptr + t * stride_x + src, mask=mask), mask=mask)


def permute_k_triton(x: torch.Tensor, block_k: int) -> torch.Tensor:
    """[T, k] (unit column stride) -> the contiguous K-permuted copy ``k_order.permute_k`` makes, in one launch."""
    t, k = x.shape
    check_block(k, block_k, "permute_k")
    if x.stride(1) != 1:
        raise ValueError(f"permute_k: x must have unit column stride (a row-major [T, k] view); found strides "
                         f"{tuple(x.stride())}; fix: pass x.contiguous()")
    out = torch.empty((t, k), dtype=x.dtype, device=x.device)
    n = t * k
    if n:
        _permute_k_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, k, x.stride(0), BK=block_k, BLOCK=BLOCK, num_warps=8)
    return out
