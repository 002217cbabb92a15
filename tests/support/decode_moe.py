"""Shared by the GPU tests of the mma.sync decode kernels (test_one_token, test_pdl): the sm90 skip, a logged fresh
seed, NVFP4 experts of varied row scales, routed tokens, and a tile pair at other split-K runs."""
import os
from dataclasses import replace

import pytest
import torch


def sm90_or_skip(why: str) -> None:
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import decode_available

    if not decode_available(torch.device("cuda")):
        pytest.skip(f"{why}: sm90 only")


def fresh_generator() -> torch.Generator:
    """A CUDA generator on a fresh seed, printed so that a failure can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator(device="cuda").manual_seed(seed)


def nvfp4_experts(g: torch.Generator, experts: int, hidden: int, inter: int):
    """(w13 [E, 2I, H], w2 [E, H, I]) quantized to NVFP4; w13's rows at scales spread over 0-3x."""
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    w13 = torch.randn(experts, 2 * inter, hidden, device="cuda", generator=g)
    w13 *= torch.rand(experts, 2 * inter, 1, device="cuda", generator=g) * 3 / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device="cuda", generator=g) / inter**0.5
    return quantize_nvfp4(w13, name="w13"), quantize_nvfp4(w2, name="w2")


def routed_tokens(g: torch.Generator, tokens: int, experts: int, hidden: int, top_k: int = 6, other: float = 0.0):
    """(x, ids, wts) of ``tokens`` tokens: activations large enough to reach the clamp, top_k distinct experts
    each, a share ``other`` of the slots on another rank's experts (-1)."""
    x = (torch.randn(tokens, hidden, device="cuda", generator=g) * 4).bfloat16()
    ids = torch.stack([torch.randperm(experts, device="cuda", generator=g)[:top_k] for _ in range(tokens)])
    ids = torch.where(torch.rand(ids.shape, device="cuda", generator=g) < other, -1, ids).to(torch.int32)
    wts = torch.softmax(torch.randn(tokens, top_k, device="cuda", generator=g), -1)
    return x, ids, wts


def with_splits(pair, s1: int, s2: int):
    """An (L1, L2) DecodeConfig pair with its K cut into ``s1`` and ``s2`` runs."""
    return replace(pair[0], split_k=s1), replace(pair[1], split_k=s2)


def on_and_off(monkeypatch, flag: str, call):
    """(``call()`` with fused_moe's switch ``flag`` on, with it off): the switch is on by default and left on."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

    assert getattr(fm, flag) is True, f"fused_moe.{flag} is on by default"
    on = call()
    monkeypatch.setattr(fm, flag, False)
    off = call()
    monkeypatch.setattr(fm, flag, True)
    torch.cuda.synchronize()
    return on, off
