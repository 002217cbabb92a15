"""align_by_expert: every routed slot lands once in its expert's padded, block-aligned run."""
import os

import pytest
import torch

from nvfp4stack.kernels.moe.hopper_w4a16.routing import (
    align_by_expert,
    align_split,
    max_padded_slots,
    one_token_routing,
    split_padded_slots,
)


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _other_ranks(ids: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """About half the slots routed to another rank's expert (-1, as the engine passes them under EP)."""
    return torch.where(torch.rand(ids.shape, generator=g) < 0.5, -1, ids)


@pytest.mark.parametrize("ep", [False, True])
@pytest.mark.parametrize("tokens,top_k,experts,block_m", [(37, 6, 8, 16), (5, 2, 16, 16), (300, 4, 32, 64), (1, 1, 4, 128)])
def test_alignment_invariants(tokens, top_k, experts, block_m, ep):
    g = torch.Generator().manual_seed(_seed())
    # ragged: expert 0 takes most slots, some experts get none
    probs = torch.rand(experts, generator=g) ** 4
    probs[0] = probs.sum() * 3
    probs[-1] = 0
    ids = torch.stack([torch.multinomial(probs, top_k, replacement=False, generator=g) for _ in range(tokens)])
    if ep:  # slots of other ranks' experts (-1) land nowhere
        ids = _other_ranks(ids, g)
    r = align_by_expert(ids, experts, block_m)
    slots = tokens * top_k
    flat = ids.reshape(-1)
    counts = torch.bincount(flat[flat >= 0], minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m

    assert r.sorted_ids.numel() == max_padded_slots(slots, experts, block_m)
    assert int(r.num_padded) == int(padded.sum())
    used = r.sorted_ids[: int(r.num_padded)]
    real = used[used < slots]
    # each slot of this rank's experts exactly once
    assert torch.equal(real.sort().values, (flat >= 0).nonzero().squeeze(1).to(torch.int32))
    # nothing real past the used range
    assert bool((r.sorted_ids[int(r.num_padded):] == slots).all())
    # every block holds slots of the expert it is labelled with, and slots keep token order
    for b in range(int(r.num_padded) // block_m):
        blk = used[b * block_m:(b + 1) * block_m]
        e = int(r.expert_ids[b])
        blk_real = blk[blk < slots].long()
        assert bool((flat[blk_real] == e).all())
        assert bool((blk_real[1:] > blk_real[:-1]).all())
    # blocks per expert match the padded counts, unused blocks are -1
    nb = int(r.num_padded) // block_m
    assert torch.equal(torch.bincount(r.expert_ids[:nb].long(), minlength=experts), padded // block_m)
    assert bool((r.expert_ids[nb:] == -1).all())
    # the kernels' grids cover every used block, and no more than the routed slots
    assert nb <= r.grid_blocks <= min(slots, r.max_blocks)


@pytest.mark.parametrize("ep", [False, True])
@pytest.mark.parametrize("tokens,top_k,experts", [(64, 6, 64), (200, 6, 48), (3, 4, 32), (37, 6, 8), (1, 1, 4)])
def test_split_regions(tokens, top_k, experts, ep):
    """align_split: experts of at most 16 slots in 16-slot blocks, the others in 32-slot blocks; every
    slot lands once in one of the two, in token order, under Zipf-skewed routing."""
    g = torch.Generator().manual_seed(_seed())
    probs = 1.0 / torch.arange(1, experts + 1, dtype=torch.float32) ** 1.1
    probs[-1] = 0  # one expert gets nothing
    ids = torch.stack([torch.multinomial(probs, top_k, replacement=False, generator=g) for _ in range(tokens)])
    if ep:
        ids = _other_ranks(ids, g)
    small, big = align_split(ids, experts, 16, 32)
    slots, flat = tokens * top_k, ids.reshape(-1)
    counts = torch.bincount(flat[flat >= 0], minlength=experts)
    assert (small.sorted_ids.numel(), big.sorted_ids.numel()) == split_padded_slots(slots, experts, 16, 32)
    seen = []
    for r, bm, mine in ((small, 16, counts <= 16), (big, 32, counts > 16)):
        n = int(r.num_padded)
        assert n == int(((counts + bm - 1) // bm * bm)[mine].sum())
        assert n // bm <= r.grid_blocks <= slots
        assert bool((r.sorted_ids[n:] == slots).all()) and bool((r.expert_ids[n // bm:] == -1).all())
        for b in range(n // bm):
            blk = r.sorted_ids[b * bm:(b + 1) * bm]
            real = blk[blk < slots].long()
            e = int(r.expert_ids[b])
            assert real.numel() > 0 and bool(mine[e]) and bool((flat[real] == e).all())
            assert bool((real[1:] > real[:-1]).all())
        seen.append(r.sorted_ids[:n][r.sorted_ids[:n] < slots])
    assert torch.equal(torch.cat(seen).sort().values, (flat >= 0).nonzero().squeeze(1).to(torch.int32))
    with pytest.raises(ValueError, match="small < big"):
        align_split(ids, experts, 32, 16)


def test_rejects_flat_ids():
    with pytest.raises(ValueError, match="topk_ids"):
        align_by_expert(torch.zeros(6, dtype=torch.int64), 4, 16)


_TRITON_CHECK = """
import sys, torch
from nvfp4stack.kernels.moe.hopper_w4a16.routing import align_by_expert, align_split
from nvfp4stack.kernels.moe.hopper_w4a16.routing_triton import align_by_expert_triton, align_split_triton
dev = sys.argv[1]
g = torch.Generator().manual_seed(int(sys.argv[2]))
bad = []
for tokens, k, e, bm in [(37, 6, 8, 16), (5, 2, 16, 8), (300, 4, 32, 8), (1, 1, 4, 16), (8, 4, 32, 8),
                         (700, 8, 256, 16), (2048, 4, 32, 16), (3, 4, 32, 8),
                         (64, 4, 64, 16), (43, 6, 64, 16),   # 256 and 258 slots: either side of SMALL_SLOTS
                         (1, 6, 256, 16), (40, 6, 256, 16), (25, 10, 512, 16)]:   # decode at Flash's 256, more
                                                                                  # experts than ids a step
    probs = torch.rand(e, generator=g) ** 4
    probs[0] = probs.sum() * 3
    probs[-1] = 0
    ids = torch.stack([torch.multinomial(probs, k, replacement=False, generator=g) for _ in range(tokens)])
    other_ranks = torch.where(torch.rand(ids.shape, generator=g) < 0.5, -1, ids)  # -1: dropped (EP)
    variants = ((torch.int32, ids), (torch.int64, ids), (torch.int32, other_ranks))
    if dev == "cpu" and e >= 256:   # the interpreter runs a program per expert: 1-5 s a call at these counts;
        variants = variants[2:]     # the dtypes are covered by the smaller cases, -1 ids by this one
    for dt, src in variants:
        i = src.to(dt).to(dev)
        pairs = [(align_by_expert(i, e, bm), align_by_expert_triton(i, e, bm))]
        pairs += zip(align_split(i, e, bm, 2 * bm), align_split_triton(i, e, bm, 2 * bm))
        for a, b in pairs:
            if not (torch.equal(a.sorted_ids, b.sorted_ids) and torch.equal(a.expert_ids, b.expert_ids)
                    and torch.equal(a.num_padded, b.num_padded)):
                bad.append((tokens, k, e, bm, a.block_m, dt))
print("mismatches:", bad)
sys.exit(1 if bad else 0)
"""


def test_the_routing_chunk_and_path_by_slot_count():
    from nvfp4stack.kernels.moe.hopper_w4a16 import routing_triton as rt

    assert [rt.chunk_slots(n) for n in (1, 6, 48, rt.SMALL_SLOTS, rt.SMALL_SLOTS + 1, rt.MAX_SLOTS)] == \
        [256, 256, 256, 256, 1024, 1024]
    assert [rt.routing_path(n) for n in (6, 300, rt.MAX_SLOTS, rt.MAX_SLOTS + 1)] == [256, 1024, 1024, None]


def test_triton_alignment_matches_torch():
    """routing_triton: align_by_expert_triton and align_split_triton bit-identical to the torch versions (GPU, or the
    Triton interpreter on CPU in a subprocess)."""
    from tests.support.triton_check import run_triton_check

    run_triton_check(_TRITON_CHECK, _seed())


def _block_pairs(r) -> set[tuple[int, int]]:
    """(expert, slot) of every routed slot the kernels compute: blocks whose expert is not negative and that lie
    before num_padded, their slots below the sentinel."""
    pairs = set()
    for b, e in enumerate(r.expert_ids.tolist()):
        if e < 0 or b * r.block_m >= int(r.num_padded):
            continue
        pairs |= {(e, s) for s in r.sorted_ids[b * r.block_m:(b + 1) * r.block_m].tolist() if s < r.num_slots}
    return pairs


@pytest.mark.parametrize("ep", [False, True])
@pytest.mark.parametrize("top_k,experts,block_m", [(6, 256, 8), (8, 128, 16), (1, 4, 8), (6, 48, 32)])
def test_one_token_routing_computes_the_same_slots(top_k, experts, block_m, ep):
    """One token's routing without a sort: every slot is a block of its own (the expert its id, a view of int32
    ids), and the kernels compute the same (expert, slot) pairs as align_by_expert's blocks; under EP the -1
    slots are in no computed block. Its buffers are what the kernels index: top_k blocks of block_m."""
    g = torch.Generator().manual_seed(_seed())
    ids = torch.randperm(experts, generator=g)[:top_k].to(torch.int32).view(1, top_k)
    if ep:
        ids = _other_ranks(ids, g)
    r = one_token_routing(ids, block_m)
    assert _block_pairs(r) == _block_pairs(align_by_expert(ids, experts, block_m))
    assert _block_pairs(r) == {(int(e), s) for s, e in enumerate(ids[0].tolist()) if e >= 0}
    assert r.expert_ids.data_ptr() == ids.data_ptr() and r.grid_blocks == top_k == r.num_slots
    assert r.sorted_ids.shape == (top_k * block_m,) and r.sorted_ids.dtype == torch.int32
    assert int(r.num_padded) == top_k * block_m
    assert one_token_routing(ids.long(), block_m).expert_ids.dtype == torch.int32
    with pytest.raises(ValueError, match=r"one token's \[1, top_k\] expert ids, found shape \(2, 6\)"):
        one_token_routing(torch.zeros(2, 6, dtype=torch.int32), block_m)
