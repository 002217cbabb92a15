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
