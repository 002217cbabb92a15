"""E2M1 encode / pack against modelopt's _cast_fp4 and packing."""
import torch
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

from nvfp4stack.formats.e2m1 import E2M1_VALUES, e2m1_decode, e2m1_encode, pack_e2m1, unpack_e2m1


def test_encode_matches_modelopt_on_dense_grid(seed):
    # every multiple of 2^-6 in [-8, 8] (includes each tie point exactly) plus random values
    grid = torch.arange(-8 * 64, 8 * 64 + 1, dtype=torch.float32) / 64
    y = torch.cat([grid, torch.randn(1 << 20) * 3, torch.tensor([-0.0, 0.0, 1e30, -1e30])])
    ours = e2m1_encode(y)
    ref = NVFP4QTensor._cast_fp4(y.clone())
    assert torch.equal(ours, ref)


def test_ties_round_to_even_and_saturate():
    y = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 100.0, -0.25, -0.1, -0.0])
    want = [0, 2, 2, 4, 4, 6, 6, 7, 7, 7, 8, 8, 0]  # -0.25 and -0.1 -> -0 (code 8), -0.0 -> 0
    assert e2m1_encode(y).tolist() == want


def test_values_roundtrip_and_pack_layout(seed):
    codes = torch.randint(0, 16, (64, 48), dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.shape == (64, 24)
    assert torch.equal(packed & 0x0F, codes[:, 0::2])  # even element in the low nibble
    assert torch.equal(unpack_e2m1(packed), codes)
    vals = e2m1_decode(codes)
    assert torch.equal(e2m1_encode(vals) & 7, codes & 7)
    assert E2M1_VALUES[8].item() == 0.0 and torch.signbit(E2M1_VALUES[8])


def test_one_ulp_around_every_threshold_and_huge_values():
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 2.0, 4.0])
    up, down = torch.nextafter(t, torch.tensor(9.0)), torch.nextafter(t, torch.tensor(-9.0))
    tiny = torch.tensor([1e-45, 1e-40, 1e-38, 3e38, 8.0, 7.999])
    y = torch.cat([t, up, down, tiny])
    y = torch.cat([y, -y])
    assert torch.equal(e2m1_encode(y), NVFP4QTensor._cast_fp4(y.clone()))
