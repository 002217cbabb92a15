"""The K order of the decode kernels' operands, in torch (CPU-importable).

Inside each block_k columns the Gluon decode kernels feed the MMA in a permuted K order, the same
for weights and activations (a dot product does not care): thread t of a lane quad owns the real
columns [t*block_k/4, (t+1)*block_k/4), so its weight bytes, scales and activations are single wide
loads (_decode_gluon._to_mma_k). The wgmma kernels copy activations into shared memory verbatim, so
they read them already in that order: real column k sits at ``stored_column(k)``.
"""
from __future__ import annotations

import torch


def stored_column(k: torch.Tensor, block_k: int) -> torch.Tensor:
    """Real column ``k`` -> its position in the K-permuted layout (per block_k columns):
    real k = (block_k/4)*q4 + 4*v + 2*d + e  ->  16*v + 8*e + 2*q4 + d."""
    q = block_k // 4
    g, r = k // block_k, k % block_k
    q4, v, d, e = r // q, (r % q) // 4, (r // 2) % 2, r % 2
    return g * block_k + 16 * v + 8 * e + 2 * q4 + d


def check_block(k: int, block_k: int, what: str) -> None:
    if block_k % 64 or k % block_k:
        raise ValueError(f"{what}: block_k must be a multiple of 64 dividing k; got k={k}, block_k={block_k}")


def k_permutation(k: int, block_k: int) -> torch.Tensor:
    """int64 [k]: position j of the permuted layout holds real column ``idx[j]``
    (``x.index_select(-1, idx)`` permutes)."""
    check_block(k, block_k, "k_permutation")
    real = torch.arange(k)
    idx = torch.empty(k, dtype=torch.int64)
    idx[stored_column(real, block_k)] = real
    return idx


def permute_k(x: torch.Tensor, block_k: int) -> torch.Tensor:
    """[T, k] -> a contiguous copy in the K-permuted layout (``x.index_select(-1, k_permutation(k, block_k))``)
    as one strided copy: real (q4, v, d, e) -> stored (v, e, q4, d) inside every block_k columns
    (an index_select gather took 7 us for Flash's [171, 4096] on an H200)."""
    t, k = x.shape
    check_block(k, block_k, "permute_k")
    return x.view(t, k // block_k, 4, block_k // 16, 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(t, k)
