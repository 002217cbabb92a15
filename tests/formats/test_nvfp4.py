"""NVFP4 quantize bit-exact vs modelopt NVFP4QTensor; dequant bit-exact vs vLLM's
nvfp4_emulation_utils.dequantize_to_dtype (both installed, never copied)."""
import pytest
import torch
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

from nvfp4stack.formats.e2m1 import unpack_e2m1
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor, dequantize_nvfp4, quantize_nvfp4, quantize_nvfp4_activation


def modelopt_quantize(x, gs=None):
    q, s, s2 = NVFP4QTensor.quantize(x.clone(), 16, weights_scaling_factor_2=gs)
    return q._quantized_data, s, s2


def assert_same_as_modelopt(x, gs=None):
    ours = quantize_nvfp4(x, gs)
    data, scale, s2 = modelopt_quantize(x, None if gs is None else torch.tensor(gs))
    assert torch.equal(ours.global_scale, s2.float())
    assert torch.equal(ours.scale.view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(ours.data, data)
    return ours


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_random_bit_exact_1e6(seed, make_weights, dtype):
    gen = torch.Generator().manual_seed(seed)
    n = 0
    for kind in ("normal", "student_t", "outliers"):
        x = make_weights(kind, (512, 768), gen, dtype)
        assert_same_as_modelopt(x)
        n += x.numel()
    assert n >= 1_000_000


def test_ties_exact_multiples_of_scale(seed):
    # amax = 6 * 2^k and gs = 2^j make bs = 2^(k-j) exact, so y hits each tie exactly
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0,
                         -0.25, -0.75, -1.75, -3.5, -5.0, 1.0, 0.5, -6.0])
    x = (ties * 2.0**-3).repeat(8, 4)  # [8, 64]
    q = assert_same_as_modelopt(x, gs=2.0**-6)
    # hand-derived: ties go to the even code, negatives carry the sign bit (-0.25 -> -0 = 8)
    want = [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 12, 14, 14, 2, 1, 15]
    assert unpack_e2m1(q.data)[0, :16].tolist() == want


def test_adversarial_blocks(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 256, generator=gen)
    x[0] = 0                                   # all-zero blocks -> scale 1.0
    x[1, :16] = 1e-6                           # below the 2^-9 scale floor after clamp
    x[2, 0] = 2688.0                           # amax exactly 448*6 -> global scale 1
    x[3, :16] = torch.tensor([-0.0] * 8 + [-1e-9] * 8)  # negative zero and tiny negatives
    x[4] *= 1e20                               # huge dynamic range across rows
    x[5] *= 1e-20
    q = assert_same_as_modelopt(x)
    assert q.scale[0].float().eq(1.0).all()
    assert_same_as_modelopt(x.bfloat16())
    # amax exactly 448*6 as the only large value
    y = torch.randn(32, 64, generator=gen)
    y[7, 9] = -2688.0
    assert assert_same_as_modelopt(y).global_scale.item() == 1.0


def test_all_zero_tensor_roundtrips_to_zero():
    # modelopt divides 0 by 0 here (NaN scales); we store global_scale 1.0 instead
    q = quantize_nvfp4(torch.zeros(16, 32))
    assert q.global_scale.item() == 1.0 and torch.equal(q.dequantize(torch.float32), torch.zeros(16, 32))


def test_per_expert_global_scale_3d(seed, make_weights):
    gen = torch.Generator().manual_seed(seed)
    x = make_weights("student_t", (4, 64, 128), gen)
    x[2] *= 50
    q = quantize_nvfp4(x)
    assert q.global_scale.shape == (4,)
    for e in range(4):
        data, scale, s2 = modelopt_quantize(x[e])
        assert torch.equal(q.data[e], data) and torch.equal(q.global_scale[e], s2.float())
        assert torch.equal(q.scale[e].view(torch.uint8), scale.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequant_bit_exact_vs_vllm_and_modelopt(seed, make_weights, dtype):
    gen = torch.Generator().manual_seed(seed)
    x = make_weights("outliers", (1024, 1024), gen)
    q = quantize_nvfp4(x)
    ours = q.dequantize(dtype)
    ref = dequantize_to_dtype(q.data, q.scale, q.global_scale, dtype, block_size=16, swizzle=False)
    int_view = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(ours.view(int_view), ref.view(int_view))  # -0.0 included
    qt, _, _ = NVFP4QTensor.quantize(x.clone(), 16)
    mo = qt.dequantize(dtype=dtype, scale=q.scale, double_scale=q.global_scale, block_sizes={-1: 16})
    assert torch.equal(ours, mo)  # modelopt decodes code 8 as +0.0; == treats -0 == +0
    # stacked experts with per-expert global scale
    x3 = make_weights("normal", (3, 32, 64), gen) * torch.tensor([1.0, 1e3, 1e-3]).view(3, 1, 1)
    q3 = quantize_nvfp4(x3.float())
    ref3 = dequantize_to_dtype(q3.data, q3.scale, q3.global_scale, dtype, 16, swizzle=False)
    assert torch.equal(q3.dequantize(dtype).view(int_view), ref3.view(int_view))


def test_activation_static_scale_matches_modelopt_and_saturates(seed):
    gen = torch.Generator().manual_seed(seed)
    calib = torch.randn(64, 128, generator=gen)
    input_scale = calib.abs().amax() / 2688
    x = torch.randn(64, 128, generator=gen) * 3  # exceeds the calibrated range
    q = quantize_nvfp4_activation(x, input_scale)
    data, scale, _ = modelopt_quantize(x, input_scale)
    assert torch.equal(q.data, data) and torch.equal(q.scale.view(torch.uint8), scale.view(torch.uint8))
    assert (q.data & 0x77).eq(0x77).any()  # some values saturate at +-6


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_inf_rejected_with_name(bad):
    x = torch.randn(4, 32)
    x[1, 3] = bad
    with pytest.raises(ValueError, match="layers.0.w1.weight"):
        quantize_nvfp4(x, name="layers.0.w1.weight")


def test_container_validation():
    x = torch.randn(8, 32)
    q = quantize_nvfp4(x)
    with pytest.raises(ValueError, match="UE8M0"):
        Nvfp4Tensor(q.data, q.scale.view(torch.uint8), q.global_scale, q.shape)
    with pytest.raises(ValueError, match="expected shape"):
        Nvfp4Tensor(q.data[:, :-1], q.scale, q.global_scale, q.shape)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.randn(4, 24), name="w")
    assert q.nbytes == 8 * 16 + 8 * 2 + 4
    assert torch.equal(dequantize_nvfp4(q.data, q.scale, q.global_scale), q.dequantize())
