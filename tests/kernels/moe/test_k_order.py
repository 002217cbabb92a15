"""The wgmma decode kernels' K order (k_order.py) against the mma.sync kernels' in-register permutation."""
import pytest
import torch

from nvfp4stack.kernels.moe.hopper_w4a16.k_order import k_permutation, permute_k, stored_column


def _to_mma_k(t: torch.Tensor, bk: int) -> torch.Tensor:
    """_decode_gluon._to_mma_k in torch: [R, BK] real K order -> mma K order."""
    r = t.shape[0]
    return t.reshape(r, 4, bk // 16, 2, 2).permute(0, 2, 4, 1, 3).reshape(r, bk)


@pytest.mark.parametrize("bk", [64, 128, 256])
def test_permuted_columns_are_what_the_mma_sync_kernels_build_in_registers(bk):
    k = 3 * bk
    x = torch.randn(5, k)
    idx = k_permutation(k, bk)
    assert sorted(idx.tolist()) == list(range(k))
    want = torch.cat([_to_mma_k(x[:, g * bk:(g + 1) * bk], bk) for g in range(k // bk)], 1)
    assert torch.equal(x.index_select(1, idx), want)
    # and stored_column is its inverse, element by element
    assert torch.equal(idx[stored_column(torch.arange(k), bk)], torch.arange(k))
    # the strided copy the forward uses is the same permutation
    xb = torch.randn(7, k, dtype=torch.bfloat16)
    assert torch.equal(permute_k(xb, bk), xb.index_select(1, idx)) and permute_k(xb, bk).is_contiguous()


def test_refuses_a_block_that_does_not_divide():
    with pytest.raises(ValueError, match="block_k must be a multiple of 64 dividing k"):
        k_permutation(1000, 128)
    with pytest.raises(ValueError, match="block_k must be a multiple of 64 dividing k"):
        permute_k(torch.zeros(2, 1000), 128)


_TRITON_CHECK = r"""
import sys
import torch
from nvfp4stack.kernels.moe.hopper_w4a16.k_order import permute_k
from nvfp4stack.kernels.moe.hopper_w4a16.k_order_triton import permute_k_triton

device, seed = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(seed)
bad = []
# decode-sized token counts, odd ones, Flash's hidden and inter and a K of one block; heavy-tailed values
# (every bit pattern of the inputs matters, so no zeros or uniform rows)
for t, k, bk in [(1, 4096, 128), (3, 2048, 128), (5, 256, 256), (7, 192, 64), (33, 4096, 256), (2, 128, 128)]:
    x = (torch.randn(t, k, generator=g) * torch.exp(2 * torch.randn(t, k, generator=g))).to(torch.bfloat16)
    x = x.to(device)
    want = permute_k(x, bk)
    got = permute_k_triton(x, bk)
    if not (torch.equal(got.view(torch.int16), want.view(torch.int16)) and got.is_contiguous()):
        bad.append((t, k, bk))
    # a row-strided view (the first k columns of a [t, 2k] buffer) reads the same, into a contiguous copy
    wide = torch.cat([x, x.flip(1)], 1)[:, :k]
    got = permute_k_triton(wide, bk)
    if not (torch.equal(got.view(torch.int16), want.view(torch.int16)) and got.is_contiguous()):
        bad.append(("strided", t, k, bk))
if permute_k_triton(torch.empty(0, 256, dtype=torch.bfloat16, device=device), 128).shape != (0, 256):
    bad.append("empty")
print("mismatches:", bad)
sys.exit(1 if bad else 0)
"""


def test_the_triton_permutation_matches_the_strided_copy():
    """k_order_triton.permute_k_triton bit-identical to permute_k (GPU, or the Triton interpreter on CPU in a
    subprocess, as tests/kernels/moe/test_routing.py does)."""
    from tests.support.triton_check import run_triton_check

    run_triton_check(_TRITON_CHECK, 20261128)


def test_the_triton_permutation_refuses_a_column_stride():
    pytest.importorskip("triton")
    from nvfp4stack.kernels.moe.hopper_w4a16.k_order_triton import permute_k_triton

    with pytest.raises(ValueError, match="unit column stride"):
        permute_k_triton(torch.zeros(256, 4, dtype=torch.bfloat16).t(), 128)
    with pytest.raises(ValueError, match="block_k must be a multiple of 64 dividing k"):
        permute_k_triton(torch.zeros(2, 1000, dtype=torch.bfloat16), 128)
