"""Token permutation for grouped MoE GEMMs: sort routed slots by expert, pad each expert to a tile.

Pure torch, no host sync, so it runs unchanged on CPU (tests) and GPU (inside the Triton path).
Same contract as vLLM's ``moe_align_block_size`` (fused_moe/moe_align_block_size.py): padded
slots hold the sentinel ``T*k``, and every block of ``block_m`` sorted slots belongs to one expert.
Slots with a negative expert id (another rank's expert under expert parallelism) appear nowhere: no
block computes them, and the top-k combine skips them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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

    @property
    def grid_blocks(self) -> int:
        """Blocks a kernel grid must cover: every block holds at least one routed slot, so never more than
        ``num_slots``; ``max_blocks`` (the buffers' bound: each expert may waste a block) is far more at decode
        (Flash, 256 experts, 8-token blocks, one token: 6 against 225, whose empty programs cost more than
        the GEMMs' work)."""
        return min(self.max_blocks, self.num_slots)


def one_token_constants(top_k: int, block_m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_ids, num_padded) of ``one_token_routing``: slot j alone at position j * block_m, the sentinel
    (top_k) after it, top_k * block_m padded slots."""
    sorted_ids = torch.full((top_k, block_m), top_k, dtype=torch.int32, device=device)
    sorted_ids[:, 0] = torch.arange(top_k, dtype=torch.int32, device=device)
    return sorted_ids.reshape(-1), torch.tensor([top_k * block_m], dtype=torch.int32, device=device)


def one_token_routing(topk_ids: torch.Tensor, block_m: int,
                      constants: tuple[torch.Tensor, torch.Tensor] | None = None) -> AlignedRouting:
    """One token's [1, top_k] choices without sorting anything: each slot a block of its own, in slot order,
    the block's expert the slot's id as given (a view where the ids are int32; a negative id, another rank's
    expert, makes the kernels skip the block, as align_by_expert leaves such a slot out). The kernels then
    compute what align_by_expert's blocks give, bit for bit (the same slot on the same expert with the same
    tiles); only the order of the blocks differs. ``constants``: one_token_constants' tensors, made once."""
    if topk_ids.dim() != 2 or topk_ids.shape[0] != 1:
        raise ValueError(f"one_token_routing: expected one token's [1, top_k] expert ids, found shape "
                         f"{tuple(topk_ids.shape)}; route more tokens with align_by_expert")
    top_k = topk_ids.shape[1]
    sorted_ids, num_padded = constants or one_token_constants(top_k, block_m, topk_ids.device)
    ids = topk_ids.reshape(-1)
    return AlignedRouting(sorted_ids, ids if ids.dtype == torch.int32 else ids.to(torch.int32), num_padded,
                          block_m, top_k)


# (small-expert routing, busy-expert routing) of align_split
Split = tuple[AlignedRouting, AlignedRouting]


def max_padded_slots(num_slots: int, num_experts: int, block_m: int) -> int:
    """Upper bound of padded slots: every expert may waste up to block_m - 1 (a static grid size)."""
    bound = num_slots + num_experts * (block_m - 1)
    return (bound + block_m - 1) // block_m * block_m


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Group the [T, k] routing choices by expert, each expert's run padded to ``block_m``.

    Slots of one expert keep their original (token-major) order, as a stable sort gives.
    Sizes are upper bounds so that the GPU never waits for the host (no ``.item()``).
    """
    slots = _rank_slots(topk_ids, num_experts)
    keep = torch.ones_like(slots.counts, dtype=torch.bool)
    return _align_region(slots, keep, block_m, max_padded_slots(topk_ids.numel(), num_experts, block_m))


def split_padded_slots(num_slots: int, num_experts: int, small: int, big: int) -> tuple[int, int]:
    """Upper bounds of the two regions of align_split: every small expert (at most ``small`` rows)
    fills exactly one ``small`` block; at most num_slots // (small + 1) experts hold more, each
    wasting up to big - 1 slots."""
    if not 0 < small < big:
        raise ValueError(f"align_split: expected 0 < small < big block sizes, found small={small}, big={big}")
    n_small = min(num_experts, num_slots)
    n_big = min(num_experts, num_slots // (small + 1))
    big_bound = (num_slots + n_big * (big - 1) + big - 1) // big * big
    return n_small * small, max(big_bound, big)


def align_split(topk_ids: torch.Tensor, num_experts: int, small: int, big: int) -> Split:
    """Two routings of one call: experts with at most ``small`` routed slots in ``small``-slot blocks,
    the others in ``big``-slot blocks (each slot in exactly one of the two). Routing is never
    balanced (bench/moe_kernel_notes.md): this lets most experts take the cheaper small tile while
    the busy ones are not split into many small blocks, each dequantizing the expert's weights again."""
    pad_small, pad_big = split_padded_slots(topk_ids.numel(), num_experts, small, big)  # checks small < big
    slots = _rank_slots(topk_ids, num_experts)
    keep = slots.counts <= small
    return _align_region(slots, keep, small, pad_small), _align_region(slots, ~keep, big, pad_big)


class _RankedSlots(NamedTuple):
    """The routed slots of [T, k] routing in expert order, what every region of a call shares."""

    counts: torch.Tensor  # [E] slots per expert (negative ids, another rank's experts, count nowhere)
    order: torch.Tensor  # [S] slot ids stably sorted by expert (negative ids first)
    expert_of: torch.Tensor  # [S] expert of order[i] (0 where its id is negative)
    rank: torch.Tensor  # [S] position of order[i] among its expert's slots
    valid: torch.Tensor  # [S] order[i]'s id is not negative


def _rank_slots(topk_ids: torch.Tensor, num_experts: int) -> _RankedSlots:
    if topk_ids.dim() != 2:
        raise ValueError(
            f"topk_ids: expected [tokens, top_k], found shape {tuple(topk_ids.shape)}; "
            "pass the router's top-k expert indices"
        )
    flat = topk_ids.reshape(-1).to(torch.int64)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat.clamp(min=0), (flat >= 0).to(torch.int64))  # bincount would sync on CUDA
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    valid = expert_of >= 0
    expert_of = expert_of.clamp(min=0)
    count_start = torch.cumsum(counts, 0) - counts + (~valid).sum()  # the negative ids sort first
    rank = torch.arange(flat.numel(), device=flat.device) - count_start[expert_of]
    return _RankedSlots(counts, order, expert_of, rank, valid)


def _align_region(slots: _RankedSlots, keep: torch.Tensor, block_m: int, max_padded: int) -> AlignedRouting:
    """The slots of the experts in ``keep``, each expert's run padded to ``block_m``, in ``max_padded``
    slots; the other experts' slots are left out (scattered past the end, then cut)."""
    counts, order, expert_of = slots.counts, slots.order, slots.expert_of
    device = order.device
    num_slots, num_experts = order.numel(), counts.numel()
    padded = torch.where(keep, (counts + block_m - 1) // block_m * block_m, 0)
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    dest = torch.where(slots.valid & keep[expert_of], padded_start[expert_of] + slots.rank, max_padded)

    sorted_ids = torch.full((max_padded + 1,), num_slots, dtype=torch.int32, device=device)
    sorted_ids[dest] = order.to(torch.int32)
    sorted_ids = sorted_ids[:max_padded]

    block_start = torch.arange(0, max_padded, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    expert_ids = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    num_padded = padded_end[-1:].to(torch.int32)
    return AlignedRouting(sorted_ids, expert_ids, num_padded, block_m, num_slots)
