"""``align_by_expert`` in one Triton launch (GPU): the decode-sized routing of the W4A16 MoE.

routing.align_by_expert is ~20 small torch kernels (scatter, two cumsums, a stable argsort,
searchsorted, ...): 47-78 us of a 270 us decode step at the bench "flash" shape (H 4096,
I 2048) in CUDA-graph replay on an H200 (bench/moe_kernel_notes.md). Here one program of 8 warps does it: per-expert counts, padded
offsets, sentinel fill, per-block expert ids, then each slot's destination from its rank among
earlier slots of the same expert (a cumulative sum over a [chunk, experts] one-hot), which
keeps the token-major order that the stable sort gives. Same outputs, bit for bit.
Used up to ``MAX_SLOTS`` routed slots; past that the torch version (parallel sort) is faster.
"""
from __future__ import annotations

import torch

from nvfp4stack.kernels.moe.hopper_w4a16.routing import AlignedRouting, align_by_expert, max_padded_slots

MAX_SLOTS = 8192


def _kernel():
    import triton
    import triton.language as tl

    # per-call sizes are not specialized (one binary per BM): see _triton_kernels._PER_CALL
    @triton.jit(do_not_specialize=["num_slots", "max_padded", "max_blocks"])
    def align_kernel(
        ids_ptr, num_slots, num_experts,
        sorted_ptr, max_padded, expert_ids_ptr, max_blocks, num_padded_ptr,
        EP2: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr, FILL: tl.constexpr,
    ):
        e_idx = tl.arange(0, EP2)
        e_ok = e_idx < num_experts
        counts = tl.zeros([EP2], dtype=tl.int32)
        for c0 in range(0, num_slots, CH):
            offs = c0 + tl.arange(0, CH)
            ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=-1).to(tl.int32)
            counts += tl.sum((ids[:, None] == e_idx[None, :]).to(tl.int32), axis=0)
        padded = (counts + BM - 1) // BM * BM
        padded_end = tl.cumsum(padded, 0)
        padded_start = padded_end - padded
        tl.store(num_padded_ptr, tl.sum(padded, 0))
        for p0 in range(0, max_padded, FILL):
            offs = p0 + tl.arange(0, FILL)
            tl.store(sorted_ptr + offs, tl.zeros([FILL], dtype=tl.int32) + num_slots, mask=offs < max_padded)
        for b0 in range(0, max_blocks, CH):
            blk = b0 + tl.arange(0, CH)
            start = blk * BM
            ex = tl.sum(((padded_end[None, :] <= start[:, None]) & e_ok[None, :]).to(tl.int32), axis=1)
            ex = tl.where(ex < num_experts, ex, -1)
            tl.store(expert_ids_ptr + blk, ex, mask=blk < max_blocks)
        tl.debug_barrier()  # the sentinel fill above must land before the scatter below
        run = padded_start
        for c0 in range(0, num_slots, CH):
            offs = c0 + tl.arange(0, CH)
            m = offs < num_slots
            ids = tl.load(ids_ptr + offs, mask=m, other=-1).to(tl.int32)
            onehot = (ids[:, None] == e_idx[None, :]).to(tl.int32)
            incl = tl.cumsum(onehot, 0)
            dest = tl.sum(onehot * (incl - 1 + run[None, :]), axis=1)
            tl.store(sorted_ptr + dest, offs, mask=m)
            run += tl.sum(onehot, axis=0)

    return align_kernel


_KERNEL = None


def align_by_expert_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Same contract and outputs as routing.align_by_expert; CUDA tensors, one launch."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _kernel()
    flat = topk_ids.reshape(-1)
    if flat.dtype not in (torch.int32, torch.int64):
        flat = flat.to(torch.int32)
    flat = flat.contiguous()
    num_slots = flat.numel()
    max_padded = max_padded_slots(num_slots, num_experts, block_m)
    dev = topk_ids.device
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_padded // block_m, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    ep2 = max(16, 1 << (num_experts - 1).bit_length())
    ch = max(16, 8192 // ep2)
    _KERNEL[(1,)](
        flat, num_slots, num_experts, sorted_ids, max_padded, expert_ids, expert_ids.numel(), num_padded,
        EP2=ep2, BM=block_m, CH=ch, FILL=1024, num_warps=8,
    )
    return AlignedRouting(sorted_ids, expert_ids, num_padded, block_m, num_slots)


def align_routing(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """The faster of the two alignments for this load (same outputs): one Triton launch for CUDA
    tensors up to ``MAX_SLOTS`` routed slots, the torch version otherwise (and on CPU)."""
    if topk_ids.is_cuda and topk_ids.numel() <= MAX_SLOTS:
        return align_by_expert_triton(topk_ids, num_experts, block_m)
    return align_by_expert(topk_ids, num_experts, block_m)
