"""MXFP4 vs modelopt MXFP4QTensor (scales bit-exact; codes identical except at exact ties,
where we round to even per the OCP MX spec and modelopt rounds toward zero, and at 0.0, which
modelopt encodes as -0) and vs vLLM's _dequant_mxfp4_ue8m0_gran32 (dequant bit-exact)."""
import pytest
import torch
from modelopt.torch.quantization.qtensor.mxfp4_tensor import MXFP4QTensor
from vllm.model_executor.layers.fused_moe.flashinfer_moe_ep import _dequant_mxfp4_ue8m0_gran32

from nvfp4stack.formats.e2m1 import unpack_e2m1
from nvfp4stack.formats.mxfp4 import Mxfp4Tensor, quantize_mxfp4

TIES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def check_against_modelopt(x):
    ours = quantize_mxfp4(x)
    qt, scale = MXFP4QTensor.quantize(x.clone(), 32)
    assert torch.equal(ours.scale, scale.view(ours.scale.shape))
    a, b = unpack_e2m1(ours.data), unpack_e2m1(qt._quantized_data)
    diff = a != b
    y = (x.float().reshape(-1, 32) / torch.exp2(scale.float() - 127)).reshape(x.shape)
    explained = torch.isin(y.abs(), TIES) | (x == 0)
    assert not (diff & ~explained).any(), "codes differ away from ties/zeros"
    # at a tie ours is the even code (magnitude index even)
    assert ((a[diff & (x != 0)] & 1) == 0).all()
    return ours, qt, scale


def test_random_1e6_vs_modelopt(seed, make_weights):
    gen = torch.Generator().manual_seed(seed)
    n = 0
    for kind in ("normal", "student_t", "outliers"):
        x = make_weights(kind, (512, 768), gen)
        check_against_modelopt(x)
        n += x.numel()
    assert n >= 1_000_000


def test_adversarial_vs_modelopt(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 128, generator=gen)
    x[0] = 0
    x[1, :32] = torch.cat([torch.tensor([6.0]), TIES, -TIES, torch.zeros(17)]) * 2.0**-5
    x[2] *= 1e30
    x[3] *= 1e-30
    x[4, :32] = -0.0
    ours, _, _ = check_against_modelopt(x)
    assert ours.scale[0].eq(0).all()  # zero block -> 2^-127, as modelopt
    assert unpack_e2m1(ours.data)[1, :8].tolist() == [7, 0, 2, 2, 4, 4, 6, 6]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequant_bit_exact_vs_vllm_and_modelopt(seed, make_weights, dtype):
    x = make_weights("student_t", (256, 1024), torch.Generator().manual_seed(seed))
    ours, qt, scale = check_against_modelopt(x)
    got = ours.dequantize(torch.bfloat16)
    assert torch.equal(got.view(torch.int16), _dequant_mxfp4_ue8m0_gran32(ours.data, ours.scale).view(torch.int16))
    # vLLM also takes the release's float8_e8m0fnu scale dtype
    ref_e8 = _dequant_mxfp4_ue8m0_gran32(ours.data.view(torch.int8), ours.scale.view(torch.float8_e8m0fnu))
    assert torch.equal(got, ref_e8)
    mo = qt.dequantize(dtype=dtype, scale=scale, block_sizes={-1: 32})
    ours_mo = Mxfp4Tensor(qt._quantized_data, scale.view(ours.scale.shape), x.shape).dequantize(dtype)
    assert torch.equal(ours_mo, mo)


def test_rejects_bad_input_and_containers():
    x = torch.randn(4, 64)
    x[0, 0] = float("nan")
    with pytest.raises(ValueError, match="experts.3.w1"):
        quantize_mxfp4(x, name="experts.3.w1")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.randn(4, 48))
    q = quantize_mxfp4(torch.randn(4, 64))
    with pytest.raises(ValueError, match="NVFP4"):
        Mxfp4Tensor(q.data, q.scale.view(torch.float8_e4m3fn), q.shape)
    with pytest.raises(ValueError, match="255"):
        Mxfp4Tensor(q.data, torch.full_like(q.scale, 255), q.shape)
