"""The tile-contiguous layout of packed NVFP4 experts (hopper_w4a16/tiles.py): CPU checks of the byte
moves and of the address formula the kernels use (the kernels themselves: test_triton_w4a16.py,
bit-identical outputs on both layouts, GPU)."""
import pytest
import torch

from nvfp4stack.kernels.moe.hopper_w4a16 import tiles


def _bytes(e, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("l1", [True, False])
@pytest.mark.parametrize("e,n,k", [(1, 64, 128), (3, 128, 256), (2, 384, 640)])
def test_round_trip_and_address_formula(e, n, k, l1):
    data = _bytes(e, n, k, seed=n + k)
    t = tiles.to_tiles(data, l1)
    assert t.shape == data.shape and t.dtype == torch.uint8 and t.is_contiguous()
    # the bytes moved (random data: no accidental fixed point)
    assert not torch.equal(t, data)
    assert torch.equal(tiles.from_tiles(t, l1), data)
    # every byte where the kernels look for it: storage row s holds checkpoint row l1_row(s) (w13)
    # or s (w2); byte kb of it sits at byte_offset(s, kb) of the expert, once the words' bits are back
    s = torch.arange(n).view(-1, 1)
    kb = torch.arange(k // 2).view(1, -1)
    row = tiles.l1_row(s, n // 2) if l1 else s
    flat = tiles.from_stored_words(t).view(e, -1)
    for x in range(e):
        assert torch.equal(flat[x][tiles.byte_offset(s, kb, k)], data[x][row.expand(-1, k // 2), kb.expand(n, -1)])
    # each atom (64 rows x 64 bytes) is one contiguous 4 KB block, atoms of a row block adjacent along K
    first = tiles.byte_offset(torch.tensor(64 if n > 64 else 0), torch.tensor(64), k)
    assert first == (k // 128 if n > 64 else 0) * 4096 + 4096


def _tiled_dequant_twin(word: torch.Tensor) -> list[torch.Tensor]:
    """The integer ops of _triton_kernels._PTX_TILED on stored words (int64 holding uint32):
    its four bf16 pairs as uint32."""
    m = 0x81C081C0
    u32 = 0xFFFFFFFF
    t = ((word >> 7) & 0x00D800D8) * 2081 & u32
    return [word & m, (word * 8 & u32) & m, (word * 64 & u32) & m, t & m]


def test_word_bits_are_what_the_tiled_dequant_reads():
    """Every code in every position of a word, next to random codes, comes out of the tiled dequant's
    integer ops (twin above) as the row-major dequant's bf16 bits (sign at 15, exponent|mantissa at
    6..8) in the pair and half of tiles.PAIR_CODES; words round-trip."""
    g = torch.Generator().manual_seed(7)
    words = torch.randint(0, 1 << 32, (16 * 8 * 64,), dtype=torch.int64, generator=g)
    pos = torch.arange(words.numel()) // 64 % 8  # code position forced to every value 0..15
    val = torch.arange(words.numel()) // 512
    words = (words & ~(0xF << (4 * pos))) | (val << (4 * pos))
    data = words.view(torch.uint8).view(-1, 8)[:, :4].contiguous()
    stored = tiles.to_stored_words(data)
    assert torch.equal(tiles.from_stored_words(stored), data)
    sw = stored.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    cw = data.view(torch.int32).to(torch.int64).view(-1) & 0xFFFFFFFF
    pairs = _tiled_dequant_twin(sw.view(-1))
    for j, (lo, hi) in enumerate(tiles.PAIR_CODES):
        for half, c in ((0, lo), (1, hi)):
            code = cw >> (4 * c) & 0xF
            want = (code >> 3) << 15 | (code & 7) << 6
            assert torch.equal(pairs[j] >> (16 * half) & 0xFFFF, want), f"pair {j} half {half} (code {c})"
    assert sorted(tiles.WORD_BITS) == list(range(32))


def test_l1_row_order_interleaves_gate_and_up():
    inter = 64
    s = torch.arange(2 * inter)
    row = tiles.l1_row(s, inter)
    assert row[:16].tolist() == list(range(8)) + list(range(inter, inter + 8))
    assert sorted(row.tolist()) == list(range(2 * inter))  # a permutation
    assert torch.equal(tiles.l1_storage_row(row, inter), s)
    assert torch.equal(tiles.l1_row(tiles.l1_storage_row(s, inter), inter), s)


def test_fits_and_errors_name_the_tensor_and_the_fix():
    assert tiles.fits(4096, 4096) and tiles.fits(7168, 3072) and tiles.fits(6144, 7168)
    assert not tiles.fits(96, 128)  # rows not a multiple of 64
    assert not tiles.fits(128, 192)  # K not a multiple of 128
    assert not tiles.fits(160, 128)  # w13 of I = 80
    with pytest.raises(ValueError, match=r"w2: \[E, N, K\] = \[2, 256, 192\].*tiled=False"):
        tiles.to_tiles(torch.zeros(2, 256, 96, dtype=torch.uint8), False, "w2")
    with pytest.raises(ValueError, match="w13: expected packed NVFP4 bytes"):
        tiles.to_tiles(torch.zeros(2, 256, 96, dtype=torch.int8), True, "w13")


def test_tile_experts_keeps_scales_and_leaves_inputs():
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    g = torch.Generator().manual_seed(1)
    w13 = quantize_nvfp4(torch.randn(2, 128, 256, generator=g), name="w13")
    w2 = quantize_nvfp4(torch.randn(2, 256, 64 * 2, generator=g), name="w2")
    before = w13.data.clone(), w2.data.clone()
    assert tiles.experts_fit(w13, w2)
    t13, t2 = tiles.tile_experts(w13, w2)
    assert torch.equal(w13.data, before[0]) and torch.equal(w2.data, before[1])  # inputs untouched
    assert t13.scale is w13.scale and t2.global_scale is w2.global_scale and t13.shape == w13.shape
    assert torch.equal(tiles.from_tiles(t13.data, True), w13.data)
    assert torch.equal(tiles.from_tiles(t2.data, False), w2.data)


def test_prepare_tiles_only_where_the_sm90_kernels_run():
    """triton_w4a16.prepare on CPU tensors (planning on a CPU host): the checkpoint's bytes as they
    are; PackedExperts carries the layout flag through the custom op's tensors."""
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4
    from nvfp4stack.kernels.base import MoeWeights
    from nvfp4stack.kernels.moe.hopper_w4a16.packed import PackedExperts
    from nvfp4stack.kernels.moe.triton_w4a16 import TritonW4A16Moe

    g = torch.Generator().manual_seed(2)
    w13 = quantize_nvfp4(torch.randn(2, 128, 256, generator=g), name="w13")
    w2 = quantize_nvfp4(torch.randn(2, 256, 64, generator=g), name="w2")
    p = TritonW4A16Moe.prepare(MoeWeights(w13, w2))
    assert not p.tiled and p.weights.w13.data is w13.data
    back = PackedExperts.from_op_tensors(*p.op_tensors(), tiled=True)
    assert back.tiled and back.weights.w13.data is w13.data and back.weights.w2.shape == w2.shape
