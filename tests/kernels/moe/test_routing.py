"""align_by_expert: every routed slot lands once in its expert's padded, block-aligned run."""
import os

import pytest
import torch

from nvfp4stack.kernels.moe.routing import align_by_expert, max_padded_slots


def _seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


@pytest.mark.parametrize("tokens,top_k,experts,block_m", [(37, 6, 8, 16), (5, 2, 16, 16), (300, 4, 32, 64), (1, 1, 4, 128)])
def test_alignment_invariants(tokens, top_k, experts, block_m):
    g = torch.Generator().manual_seed(_seed())
    # ragged: expert 0 takes most slots, some experts get none
    probs = torch.rand(experts, generator=g) ** 4
    probs[0] = probs.sum() * 3
    probs[-1] = 0
    ids = torch.stack([torch.multinomial(probs, top_k, replacement=False, generator=g) for _ in range(tokens)])
    r = align_by_expert(ids, experts, block_m)
    slots = tokens * top_k
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m

    assert r.sorted_ids.numel() == max_padded_slots(slots, experts, block_m)
    assert int(r.num_padded) == int(padded.sum())
    used = r.sorted_ids[: int(r.num_padded)]
    real = used[used < slots]
    # each slot exactly once
    assert torch.equal(real.sort().values, torch.arange(slots, dtype=torch.int32))
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


def test_rejects_flat_ids():
    with pytest.raises(ValueError, match="topk_ids"):
        align_by_expert(torch.zeros(6, dtype=torch.int64), 4, 16)
