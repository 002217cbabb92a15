"""``align_by_expert`` and ``align_split`` in one Triton launch (GPU): the decode-sized routing of the W4A16 MoE.

routing.align_by_expert is ~20 small torch kernels (scatter, two cumsums, a stable argsort,
searchsorted, ...): 47-78 us of a 270 us decode step at the bench "flash" shape (H 4096,
I 2048) in CUDA-graph replay on an H200 (bench/moe_kernel_notes.md). Here one launch of one program
per expert (_routing_kernel.py) does it: each counts the slots of every expert (a histogram), so it
knows where its expert's run starts, then writes its slots in token-major order (their rank from a
cumulative sum of its matches, the order the stable sort gives), its padding and its blocks' expert
id; one more program writes what lies past the last run. Same outputs, bit for bit. The first
version, one program for all experts (a cumulative sum over a [chunk, experts] one-hot), took 27-39
us at 48-64 experts on an H200; this one 3-5 us (bench/RESULTS.md).
Used up to ``MAX_SLOTS`` routed slots (49,152: a default 8,192-token prefill chunk at top-6); past that the torch
version (parallel sort, ~20 launches) is used. H200, CUDA graphs, 2026-11-27 (bench/tools/routing_chunk_ab.py
--prefill): 29.8 / 75.4 / 110.6 us at 12,288 / 32,766 / 49,152 slots against torch's 150 / 168 / 176 us, 19-47 us
under EP (half the ids -1) against 172-182; torch is faster only from about 80k (225 against 190 us at 98,304).
Eager, as vLLM runs a prefill, torch's launches cost more still: one Flash MoE layer at a 2k prefill took 3.3 ms
eager with it and 1.5 ms with this kernel (bench/tools/ep_prefill_ab.py --max-slots). The cut was 8,192 until
then. Each program reads the routed ids in chunks of ``chunk_slots(num_slots)``: 256 up to ``SMALL_SLOTS``, 1024
past them (H200, 256 experts, CUDA graphs, 2026-11-27: 2.7 / 3.1 / 3.1 us with 256 at 6 / 48 / 192
slots against 4.2 / 4.5 / 4.6 us with 1024; from 768 slots 1024 is the faster: 4.7 against 5.1 us,
9.2 against 13.9 us at 3,072).
"""
from __future__ import annotations

import torch

from nvfp4stack.kernels.moe.hopper_w4a16.routing import (
    AlignedRouting,
    Split,
    align_by_expert,
    align_split,
    max_padded_slots,
    one_token_constants,
    one_token_routing,
    split_padded_slots,
)

MAX_SLOTS = 49152
SMALL_SLOTS = 256
_ONE_TOKEN: dict = {}  # (device, top_k, block_m) -> one_token_constants' tensors


def chunk_slots(num_slots: int) -> int:
    """The ids a routing program reads per step (the kernel's CH): 256 up to SMALL_SLOTS, else 1024."""
    return 256 if num_slots <= SMALL_SLOTS else 1024


def routing_path(num_slots: int) -> int | None:
    """Which routing binary a CUDA call of ``num_slots`` routed slots runs: the Triton kernel's chunk
    (``chunk_slots``), or None past MAX_SLOTS (the torch version, no Triton binary). The forward's
    choice (``align_routing``) and the warm-up's launch keys both come from here."""
    return chunk_slots(num_slots) if num_slots <= MAX_SLOTS else None


def align_by_expert_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Same contract and outputs as routing.align_by_expert; CUDA tensors, one launch."""
    return _launch(topk_ids, num_experts, (max_padded_slots(topk_ids.numel(), num_experts, block_m),), (block_m,))[0]


def align_split_triton(topk_ids: torch.Tensor, num_experts: int, small: int, big: int) -> Split:
    """Same contract and outputs as routing.align_split; CUDA tensors, one launch."""
    return _launch(topk_ids, num_experts, split_padded_slots(topk_ids.numel(), num_experts, small, big), (small, big))


def _launch(topk_ids: torch.Tensor, num_experts: int, sizes: tuple[int, ...], blocks: tuple[int, ...]) \
        -> tuple[AlignedRouting, ...]:
    """One routing per (padded slots, block size): one for align_by_expert, align_split's two."""
    from nvfp4stack.kernels.moe.hopper_w4a16._routing_kernel import align_kernel

    flat = topk_ids.reshape(-1)
    if flat.dtype not in (torch.int32, torch.int64):
        flat = flat.to(torch.int32)
    flat = flat.contiguous()
    num_slots = flat.numel()
    dev = topk_ids.device
    outs = [tuple(torch.empty(n, dtype=torch.int32, device=dev) for n in (padded, padded // bm, 1))
            for padded, bm in zip(sizes, blocks)]
    # the unsplit kernel takes the one region's buffers twice and leaves the second set alone
    (s1, e1, n1), (s2, e2, n2) = outs[0], outs[-1]
    ep2 = max(16, 1 << (num_experts - 1).bit_length())
    align_kernel[(num_experts + 1,)](
        flat, num_slots, num_experts, s1, s1.numel(), e1, e1.numel(), n1, s2, s2.numel(), e2, e2.numel(), n2,
        EP2=ep2, BM=blocks[0], CH=chunk_slots(num_slots), FILL=1024, SPLIT=blocks[0] if len(blocks) == 2 else 0, BM2=blocks[-1],
        num_warps=4,
    )
    return tuple(AlignedRouting(*out, bm, num_slots) for out, bm in zip(outs, blocks))


def align_routing(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """The faster of the two alignments for this load (same outputs): one Triton launch for CUDA
    tensors up to ``MAX_SLOTS`` routed slots, the torch version otherwise (and on CPU)."""
    if topk_ids.is_cuda and routing_path(topk_ids.numel()) is not None:
        return align_by_expert_triton(topk_ids, num_experts, block_m)
    return align_by_expert(topk_ids, num_experts, block_m)


def align_routing_split(topk_ids: torch.Tensor, num_experts: int, small: int, big: int) -> Split:
    """routing.align_split, in one Triton launch where align_routing would use one."""
    if topk_ids.is_cuda and routing_path(topk_ids.numel()) is not None:
        return align_split_triton(topk_ids, num_experts, small, big)
    return align_split(topk_ids, num_experts, small, big)


def one_token_routing_cached(topk_ids: torch.Tensor, block_m: int) -> AlignedRouting | None:
    """routing.one_token_routing with its constant tensors made once per (device, top_k, block_m), outside
    CUDA-graph capture (a fill captured in a graph would run only at its replays); None where they are first
    asked for inside capture (the caller routes with align_routing then). The forward's first one-token call
    (vLLM's warm-up runs, triton_w4a16's warm_up) makes them."""
    key = (str(topk_ids.device), topk_ids.shape[1], block_m)
    constants = _ONE_TOKEN.get(key)
    if constants is None:
        if topk_ids.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        constants = _ONE_TOKEN[key] = one_token_constants(topk_ids.shape[1], block_m, topk_ids.device)
    return one_token_routing(topk_ids, block_m, constants)
