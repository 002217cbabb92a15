"""align_by_expert: every routed slot lands once in its expert's padded, block-aligned run."""
import os

import pytest
import torch

from nvfp4stack.kernels.moe.hopper_w4a16.routing import align_by_expert, max_padded_slots


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


_TRITON_CHECK = """
import sys, torch
from nvfp4stack.kernels.moe.hopper_w4a16.routing import align_by_expert
from nvfp4stack.kernels.moe.hopper_w4a16.routing_triton import align_by_expert_triton
dev = sys.argv[1]
g = torch.Generator().manual_seed(int(sys.argv[2]))
bad = []
for tokens, k, e, bm in [(37, 6, 8, 16), (5, 2, 16, 8), (300, 4, 32, 8), (1, 1, 4, 16), (8, 4, 32, 8),
                         (700, 8, 256, 16), (2048, 4, 32, 16), (3, 4, 32, 8)]:
    probs = torch.rand(e, generator=g) ** 4
    probs[0] = probs.sum() * 3
    probs[-1] = 0
    ids = torch.stack([torch.multinomial(probs, k, replacement=False, generator=g) for _ in range(tokens)])
    for dt in (torch.int32, torch.int64):
        i = ids.to(dt).to(dev)
        a, b = align_by_expert(i, e, bm), align_by_expert_triton(i, e, bm)
        if not (torch.equal(a.sorted_ids, b.sorted_ids) and torch.equal(a.expert_ids, b.expert_ids)
                and torch.equal(a.num_padded, b.num_padded)):
            bad.append((tokens, k, e, bm, dt))
print("mismatches:", bad)
sys.exit(1 if bad else 0)
"""


def test_triton_alignment_matches_torch():
    """routing_triton.align_by_expert_triton: bit-identical to align_by_expert (GPU, or the
    Triton interpreter on CPU in a subprocess)."""
    import subprocess
    import sys

    pytest.importorskip("triton")
    seed = _seed()
    if torch.cuda.is_available():
        cmd, env = [sys.executable, "-c", _TRITON_CHECK, "cuda", str(seed)], dict(os.environ)
    else:
        cmd, env = [sys.executable, "-c", _TRITON_CHECK, "cpu", str(seed)], dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    print(r.stdout[-2000:], r.stderr[-2000:])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
