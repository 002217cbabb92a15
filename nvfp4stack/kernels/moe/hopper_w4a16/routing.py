"""Token permutation for grouped MoE GEMMs: sort routed slots by expert, pad each expert to a tile.

Pure torch, no host sync, so it runs unchanged on CPU (tests) and GPU (inside the Triton path).
Same contract as vLLM's ``moe_align_block_size`` (fused_moe/moe_align_block_size.py): padded
slots hold the sentinel ``T*k``, and every block of ``block_m`` sorted slots belongs to one expert.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AlignedRouting:
    """Routed slots grouped by expert and padded to ``block_m``.

    sorted_ids:   int32 [max_padded]; flat slot ``t*k + j`` of token t's j-th choice, or the
                  sentinel ``num_slots`` for padding.
    expert_ids:   int32 [max_padded // block_m]; expert of each block, -1 for blocks past the end.
    num_padded:   int32 [1]; slots actually used (a tensor, so reading it needs no host sync).
    """

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_padded: torch.Tensor
    block_m: int
    num_slots: int

    @property
    def max_blocks(self) -> int:
        return self.expert_ids.numel()


def max_padded_slots(num_slots: int, num_experts: int, block_m: int) -> int:
    """Upper bound of padded slots: every expert may waste up to block_m - 1 (a static grid size)."""
    bound = num_slots + num_experts * (block_m - 1)
    return (bound + block_m - 1) // block_m * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Group the [T, k] routing choices by expert, each expert's run padded to ``block_m``.

    Slots of one expert keep their original (token-major) order, as a stable sort gives.
    Sizes are upper bounds so that the GPU never waits for the host (no ``.item()``).
    """
    if topk_ids.dim() != 2:
        raise ValueError(
            f"topk_ids: expected [tokens, top_k], found shape {tuple(topk_ids.shape)}; "
            "pass the router's top-k expert indices"
        )
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_slots = flat.numel()
    max_padded = max_padded_slots(num_slots, num_experts, block_m)

    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync on CUDA
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    count_start = torch.cumsum(counts, 0) - counts

    order = torch.argsort(flat, stable=True)  # [num_slots] slot ids grouped by expert
    expert_of = flat[order]
    rank = torch.arange(num_slots, device=device) - count_start[expert_of]
    dest = padded_start[expert_of] + rank

    sorted_ids = torch.full((max_padded,), num_slots, dtype=torch.int32, device=device)
    sorted_ids[dest] = order.to(torch.int32)

    block_start = torch.arange(0, max_padded, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    expert_ids = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    num_padded = padded_end[-1:].to(torch.int32)
    return AlignedRouting(sorted_ids, expert_ids, num_padded, block_m, num_slots)
