"""kernels/moe/hopper_w4a16/warmup.py: the token counts that compile every triton_w4a16 binary at load.

CPU: the regime boundaries for real shapes, worked out by hand from the tile heuristics
(rows/expert = tokens * top_k / experts; decode tiles: few-row T8 < 2 <= T16 ring <= 10 < split ring <= 16 < T32 <= 32;
Triton tiles <= 32, <= 160, FP8 from 64 when its weights exist, Triton routing in 256-id chunks up to 256 slots,
1024-id chunks up to 49,152 slots, torch past them).
GPU: after warm_up, forwards at other token counts compile nothing (Triton's jit_cache_hook
counts every in-memory cache miss) and still match the fp32 twin.
"""
import os

import pytest
import torch

from nvfp4stack.kernels.moe.hopper_w4a16 import warmup as wu

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with Triton")


@pytest.mark.parametrize("decode,fp8,expected", [
    # Flash EP shape: 64 local experts, top-6, 4096 x 2048
    # one token (no routing launch, L2's top-k sum) | few-row T8 | 16-token ring | ..., 1024-id routing chunks
    # (258 slots) | split ring | FP8 | FP8, torch routing (past 49,152 slots)
    (True, True, [1, 2, 6, 43, 54, 683, 8193]),
    (True, False, [1, 2, 6, 43, 54, 683, 1707, 8193]),  # ... | split ring | 64-row | 128-row | 128-row, torch routing
    (False, False, [1, 43, 171, 342, 1707, 8193]),  # no decode kernels: one 16-row Triton tile to 16 rows
])
def test_flash_shape_boundaries(decode, fp8, expected):
    counts = wu.warmup_token_counts(6, 64, 4096, 2048, 16384, decode=decode, has_fp8=fp8)
    assert counts == expected


def test_expert_parallel_boundaries():
    """EP 8 (64 of 512 experts here, ids global): rows per expert count over the 512, so every tile
    boundary sits at 8x the tokens; the routing still switches to torch past 49,152 slots."""
    local = wu.warmup_token_counts(6, 64, 4096, 2048, 16384, decode=True, has_fp8=False)
    ep = wu.warmup_token_counts(6, 64, 4096, 2048, 16384, decode=True, has_fp8=False, routed_experts=512)
    # one token | FEW | 16-token ring (and 1024-id routing chunks: 258 slots) | split ring | 64-row Triton tile
    # (64.01 rows over the 512) | torch routing (49,158 slots) | the next Triton tile (past 160 rows)
    assert ep == [1, 2, 43, 427, 5462, 8193, 13654] and local[:5] == [1, 2, 6, 43, 54]


def test_budget_cuts_the_list_and_every_count_has_its_own_key():
    full = wu.warmup_token_counts(6, 48, 7168, 3072, 16384, decode=True, has_fp8=True)  # Pro EP shape
    assert full[0] == 1 and full == sorted(set(full))
    keys = [wu.launch_key(t, 6, 48, 7168, 3072, decode=True, has_fp8=True) for t in full]
    assert len(set(keys)) == len(keys)
    # every token count up to the budget launches what one of the warmed counts launched
    every = {wu.launch_key(t, 6, 48, 7168, 3072, decode=True, has_fp8=True) for t in range(1, 16385)}
    assert every == set(keys)
    short = wu.warmup_token_counts(6, 48, 7168, 3072, 100, decode=True, has_fp8=True)
    assert short == [t for t in full if t <= 100] and short[-1] <= 100
    assert wu.warmup_token_counts(6, 48, 7168, 3072, 1, decode=True, has_fp8=True) == [1]


def test_decode_tiles_that_do_not_fit_fall_back():
    # 2880 divides into neither decode BK: the Triton 16-row tile serves all decode loads
    counts = wu.warmup_token_counts(4, 32, 2880, 2880, 4096, decode=True, has_fp8=False)
    assert counts[:3] == [1, 65, 129]  # 1024-id routing chunks from 65 tokens (260 slots); 128 * 4 / 32 = 16 rows
    # -> 32-row tile from 129 tokens


def test_bad_budget_is_named():
    with pytest.raises(ValueError, match="max_tokens.*token budget"):
        wu.warmup_token_counts(6, 64, 4096, 2048, 0, decode=True, has_fp8=False)


def test_cpu_weights_are_not_warmed():
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    w13 = quantize_nvfp4(torch.randn(4, 128, 64, generator=g), name="w13")
    w2 = quantize_nvfp4(torch.randn(4, 64, 64, generator=g), name="w2")
    assert wu.warm_up(w13, w2, 2, 64, swiglu_limit=None) == []


@gpu
@pytest.mark.gpu
def test_nothing_compiles_after_warm_up():
    from triton import knobs

    from nvfp4stack.formats.nvfp4 import quantize_nvfp4
    from nvfp4stack.kernels.moe.hopper_w4a16 import fp8_prefill as fp
    from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import prepare_fp8_experts
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    g = torch.Generator(device="cuda").manual_seed(seed)
    experts, hidden, inter, top_k, budget, limit = 16, 1024, 512, 4, 3000, 10.0
    w13 = quantize_nvfp4(torch.randn(experts, 2 * inter, hidden, device="cuda", generator=g) / hidden**0.5, name="w13")
    w2 = quantize_nvfp4(torch.randn(experts, hidden, inter, device="cuda", generator=g) / inter**0.5, name="w2")
    fp8 = prepare_fp8_experts(w13, w2)
    counts = wu.warm_up(w13, w2, top_k, budget, swiglu_limit=limit, fp8_weights=fp8)
    assert counts and counts[0] == 1 and counts[-1] <= budget
    assert wu.warm_up(w13, w2, top_k, budget, swiglu_limit=limit, fp8_weights=fp8) == []  # once per process

    compiled: list[str] = []

    def hook(*_a, **kw):
        compiled.append(getattr(kw.get("fn"), "name", "?"))
        return False  # compile as usual: only count

    # off-boundary counts, the boundaries' neighbours, and random ones
    tokens = sorted({1, 2, 3, 7, 15, 16, 17, 33, budget - 1, budget}
                    | {c + d for c in counts for d in (-1, 0, 1) if 1 <= c + d <= budget}
                    | {int(t) for t in torch.randint(1, budget + 1, (12,), generator=g, device="cuda").tolist()})
    old = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        for t in tokens:
            x = (torch.randn(t, hidden, device="cuda", generator=g) * 2).bfloat16()
            probs = torch.rand(experts, device="cuda", generator=g) + 0.05
            probs[0] = 5.0 * experts  # skewed
            ids = torch.multinomial(probs.expand(t, -1), top_k, generator=g).to(torch.int32)
            wts = torch.softmax(torch.randn(t, top_k, device="cuda", generator=g), -1)
            out = nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=limit, mode="auto", fp8_weights=fp8)
            if t in (1, 17, budget):
                ref = nvfp4_moe_forward(x.float(), w13, w2, wts, ids, swiglu_limit=limit)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                # test_triton_w4a16's bound, or test_fp8_prefill's FP8_TOL where FP8 mode runs
                tol = 8e-2 if fp.select_mode("auto", t * top_k / experts, fp8) == "fp8" else 1e-2
                assert err <= tol, (t, err)
            assert bool(torch.isfinite(out).all())
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_cache_hook = old
    print(f"warm-up counts {counts}; {len(tokens)} later calls compiled {compiled}")
    assert compiled == [], f"compiled after warm-up at token counts {tokens}: {compiled}"


def test_split_k_tiles_have_their_own_warmup_counts():
    """On a 132-SM GPU one token at Flash 256 experts runs split-K tiles (192 CTAs per GEMM unsplit), two
    tokens the unsplit pair: each is a key of its own, so both are compiled at load. One token also skips the
    routing launch and sums its top-k rows in L2 (its own L2 binary), where the unsplit tiles of 2 tokens do not."""
    counts = wu.warmup_token_counts(6, 256, 4096, 2048, 64, decode=True, has_fp8=False, sm_count=132)
    one, two = (wu.launch_key(t, 6, 256, 4096, 2048, decode=True, has_fp8=False, sm_count=132) for t in (1, 2))
    assert [c.split_k for c in one[0]] == [2, 2] and [c.split_k for c in two[0]] == [1, 1]
    assert one[1] == "one token" and two[1] == 256 and counts[:2] == [1, 2]
    unsplit = wu.launch_key(1, 6, 256, 4096, 2048, decode=True, has_fp8=False)  # no SM count: no split
    assert [c.split_k for c in unsplit[0]] == [1, 1]
