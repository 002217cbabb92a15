"""FP8 block vs DeepGEMM's per_block_cast_to_fp8 as carried by vLLM
(vllm.utils.deep_gemm.per_block_cast_to_fp8, 'taken from DeepGEMM deep_gemm/utils/math.py').
PyPI's deep_gemm 1.0.0 (the only release there) is a CUDA JIT package from before use_ue8m0
existed, so vLLM's copy is the installed reference."""
import pytest
import torch
from vllm.utils import deep_gemm

# vLLM wraps it in torch.compile; the eager original is the same code without a ~50 s compile
per_block_cast_to_fp8 = getattr(deep_gemm.per_block_cast_to_fp8, "__wrapped__", deep_gemm.per_block_cast_to_fp8)

from nvfp4stack.formats.fp8_block import Fp8BlockTensor, dequantize_fp8_block, quantize_fp8_block


@pytest.mark.parametrize("ue8m0", [True, False])
def test_bit_exact_vs_deepgemm_recipe(seed, make_weights, ue8m0):
    gen = torch.Generator().manual_seed(seed)
    n = 0
    for kind, shape in (("normal", (800, 512)), ("student_t", (300, 1000)), ("outliers", (1024, 300))):
        x = make_weights(kind, shape, gen)
        x[:7] = 0  # includes an all-zero stripe -> amax floor 1e-4
        ours = quantize_fp8_block(x, ue8m0=ue8m0)
        q, sf = per_block_cast_to_fp8(x, use_ue8m0=ue8m0)
        assert torch.equal(ours.data.view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(ours.scale_float(), sf)
        n += x.numel()
    assert n >= 1_000_000


def test_ue8m0_byte_is_biased_exponent_hand_derived():
    # amax 448 -> sf 1 -> byte 127; amax 449 -> sf ceil to 2 -> byte 128; zero -> 1e-4/448 -> 2^-22
    x = torch.zeros(256, 128)
    x[0, 0], x[128, 5] = 448.0, -449.0
    t = quantize_fp8_block(x)
    assert t.scale.tolist() == [[127], [128]]
    assert quantize_fp8_block(torch.zeros(128, 128)).scale.item() == 127 - 22


def test_dequant_roundtrip_and_validation(seed, make_weights):
    x = make_weights("normal", (260, 390), torch.Generator().manual_seed(seed)).float()
    t = quantize_fp8_block(x)
    assert t.scale.shape == (3, 4)
    d = t.dequantize(torch.float32)
    # E4M3 has 3 mantissa bits: relative error <= 2^-4 for normal values
    big = x.abs() > 0.05
    assert ((d - x).abs()[big] <= x.abs()[big] * 2.0**-4).all()
    assert torch.equal(dequantize_fp8_block(t.data, t.scale.view(torch.float8_e8m0fnu)), t.dequantize())
    with pytest.raises(ValueError, match="ue8m0=True expects torch.uint8"):
        Fp8BlockTensor(t.data, t.scale_float(), True, t.shape)
    bad = x.clone()
    bad[3, 3] = float("inf")
    with pytest.raises(ValueError, match="attn.wq_a.weight"):
        quantize_fp8_block(bad, name="attn.wq_a.weight")
