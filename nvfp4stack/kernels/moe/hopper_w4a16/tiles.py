"""Tile-contiguous layout of packed NVFP4 expert weights for the sm90 kernels (CPU-importable torch).

A decode CTA reads 64 weight rows a K step at a time: 64 bytes (128 E2M1 codes) of each row, rows
K/2 bytes apart in the checkpoint's row-major layout. Such a stream reaches 2.25-2.56 TB/s on an
H200 against 3.80-3.89 TB/s for the same bytes stored contiguously (bench/tools/dram_pattern.py,
bench/moe_kernel_notes_history.md tenth pass). ``to_tiles`` moves the bytes of each [E, N, K/2] expert
tensor so that every atom of 64 rows x 64 bytes is one contiguous 4 KB block:

    atom (row block b, K block c) at byte (b * K/128 + c) * 4096, row j of it at + 64 * j

Atoms of one row block follow each other along K, so a tile of 64 rows x 256 codes is 8 KB
contiguous. For w13 the rows are taken in the decode kernels' order (``l1_row``): each 16 rows are
8 gate and the 8 matching up rows, so an atom holds gate and up rows n..n+31. The kernels address
this layout with ``_triton_kernels._w_rows`` / ``_w_cols``; CPU code (the torch twin, checkpoints)
never sees it. The scales stay row-major, untouched.

Within each 32-bit word (4 bytes of a row: 8 codes) the bits are shuffled (``WORD_BITS``) so that the
kernels turn a word into its four bf16 pairs with 6 integer-pipe instructions instead of ~13
(``_triton_kernels._PTX_TILED``; the integer pipe bound the decode loops:
bench/moe_kernel_notes_history.md, fourteenth pass). Pair j holds codes ``PAIR_CODES[j]`` (code c: bits
4c..4c+3 of the checkpoint's word) in its low and high 16 bits; the low code's (m, e0, e1, sign)
bits are stored at ``PAIR_BITS[j]``, the high code's 16 bits above.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nvfp4stack.formats.nvfp4 import Nvfp4Tensor

ATOM_ROWS = 64
ATOM_BYTES = 64  # 128 E2M1 codes of each row

# the four bf16 pairs of a word, in the order of the dequant's outputs: (low, high) checkpoint codes ...
PAIR_CODES = ((0, 2), (4, 6), (1, 3), (5, 7))
# ... and the stored bits of the low code's (m, e0, e1, sign): pair 0 as they are, pair 1 shifted left 3,
# pair 2 left 6 (each then one mask), pair 3 shifted right 7, masked and multiplied by 1 + 2**5 + 2**11
PAIR_BITS = ((6, 7, 8, 15), (3, 4, 5, 12), (0, 1, 2, 9), (13, 14, 10, 11))
# WORD_BITS[b]: the checkpoint bit that stored bit b of a word holds
_CHECKPOINT_BIT = {bits[f] + 16 * h: 4 * codes[h] + f
                   for codes, bits in zip(PAIR_CODES, PAIR_BITS) for h in (0, 1) for f in range(4)}
WORD_BITS = tuple(_CHECKPOINT_BIT[b] for b in range(32))
_WORDS_PER_CHUNK = 1 << 22


@lru_cache(maxsize=None)
def _byte_tables(to_stored: bool, device: torch.device) -> torch.Tensor:
    """[4, 256] int32: byte i's bits of a word, each moved to its bit in the other layout (built once per
    direction and device, not once per expert tensor at load)."""
    move = {c: b for b, c in enumerate(WORD_BITS)} if to_stored else dict(enumerate(WORD_BITS))
    table = [[sum(1 << move[8 * i + t] for t in range(8) if v >> t & 1) for v in range(256)] for i in range(4)]
    return torch.tensor([[v - (1 << 32) if v >> 31 else v for v in row] for row in table], dtype=torch.int32,
                        device=device)


def _move_bits_(buf: torch.Tensor, to_stored: bool) -> torch.Tensor:
    """Every 4-byte word of contiguous uint8 ``buf`` with its bits moved (WORD_BITS), in place."""
    table = _byte_tables(to_stored, buf.device)
    src = buf.view(-1, 4)
    words = buf.view(-1).view(torch.int32)
    for w0 in range(0, src.shape[0], _WORDS_PER_CHUNK):  # bounded temporaries for 100s-of-MB tensors
        b = src[w0:w0 + _WORDS_PER_CHUNK].to(torch.int32)
        word = table[0].index_select(0, b[:, 0])
        for i in range(1, 4):
            word |= table[i].index_select(0, b[:, i])
        words[w0:w0 + _WORDS_PER_CHUNK] = word
    return buf


def to_stored_words(data: torch.Tensor) -> torch.Tensor:
    """Packed bytes (a multiple of 4 per row) -> a new tensor: the same words in the tile layout's bit order."""
    return _move_bits_(data.clone(memory_format=torch.contiguous_format), True)


def from_stored_words(data: torch.Tensor) -> torch.Tensor:
    """Inverse of ``to_stored_words``."""
    return _move_bits_(data.clone(memory_format=torch.contiguous_format), False)


def l1_row(t: torch.Tensor, inter: int) -> torch.Tensor:
    """Storage row ``t`` of a tiled w13 -> its row in the checkpoint's [gate (I rows); up (I rows)]:
    within each 16 rows, 8 gate rows then the same 8 up rows (``_decode_gluon._l1_weight_rows``)."""
    return (t // 16) * 8 + t % 8 + ((t // 8) % 2) * inter


def l1_storage_row(row: torch.Tensor, inter: int) -> torch.Tensor:
    """Inverse of ``l1_row``: checkpoint row of w13 -> its storage row in the tiled layout."""
    up = row >= inter
    g = torch.where(up, row - inter, row)
    return (g // 8) * 16 + g % 8 + up.to(g.dtype) * 8


def fits(n: int, k: int) -> bool:
    """Whether an [E, n, k] expert weight (k codes per row) tiles into whole atoms (for w13, n = 2I a
    multiple of 64 also makes each atom 32 gate and their 32 up rows)."""
    return n % ATOM_ROWS == 0 and k % (2 * ATOM_BYTES) == 0


def check_fits(data: torch.Tensor, name: str) -> None:
    if data.dtype != torch.uint8 or data.ndim != 3:
        raise ValueError(f"{name}: expected packed NVFP4 bytes [E, N, K/2] uint8, found {data.dtype} "
                         f"{tuple(data.shape)}")
    e, n, kb = data.shape
    if not fits(n, 2 * kb):
        raise ValueError(f"{name}: [E, N, K] = [{e}, {n}, {2 * kb}] does not tile into {ATOM_ROWS}-row x "
                         f"{2 * ATOM_BYTES}-code atoms (N a multiple of 64, K of 128); "
                         "keep the row-major layout (tiled=False) for this shape")


def to_tiles(data: torch.Tensor, l1: bool, name: str = "weight") -> torch.Tensor:
    """[E, N, K/2] packed bytes, row-major -> a new tensor of the same shape in the tile layout."""
    check_fits(data, name)
    e, n, kb = data.shape
    if l1:
        data = data.index_select(1, l1_row(torch.arange(n, device=data.device), n // 2))
    t = torch.empty(e, n // ATOM_ROWS, kb // ATOM_BYTES, ATOM_ROWS, ATOM_BYTES, dtype=data.dtype, device=data.device)
    t.copy_(data.reshape(e, n // ATOM_ROWS, ATOM_ROWS, kb // ATOM_BYTES, ATOM_BYTES).transpose(2, 3))
    return _move_bits_(t, True).view(e, n, kb)


def from_tiles(data: torch.Tensor, l1: bool, name: str = "weight") -> torch.Tensor:
    """Inverse of ``to_tiles``: the checkpoint's row-major bytes."""
    check_fits(data, name)
    e, n, kb = data.shape
    rows = from_stored_words(data).reshape(e, n // ATOM_ROWS, kb // ATOM_BYTES, ATOM_ROWS, ATOM_BYTES).transpose(2, 3)
    rows = rows.contiguous().view(e, n, kb)
    if l1:
        rows = rows.index_select(1, l1_storage_row(torch.arange(n, device=data.device), n // 2))
    return rows


def byte_offset(t: torch.Tensor, kb: torch.Tensor, k: int) -> torch.Tensor:
    """Offset within one expert of storage row ``t``, byte ``kb`` of the row (k codes per row): the
    formula of ``_triton_kernels._w_rows + _w_cols``, in torch for the CPU tests. The word there holds
    the row's bytes kb - kb % 4 .. + 3 with their bits moved (``WORD_BITS``)."""
    return (t // ATOM_ROWS) * (ATOM_ROWS * k // 2) + (t % ATOM_ROWS) * ATOM_BYTES \
        + (kb // ATOM_BYTES) * (ATOM_ROWS * ATOM_BYTES) + kb % ATOM_BYTES


def experts_fit(w13: "Nvfp4Tensor", w2: "Nvfp4Tensor") -> bool:
    """Whether both expert weights of an MoE tile (``fits``)."""
    return fits(w13.shape[-2], w13.shape[-1]) and fits(w2.shape[-2], w2.shape[-1])


def tile_experts(w13: "Nvfp4Tensor", w2: "Nvfp4Tensor") -> tuple["Nvfp4Tensor", "Nvfp4Tensor"]:
    """New (w13, w2) whose packed bytes are in the tile layout (scales and global scales shared with
    the inputs, which are left as they are). Only the W4A16 kernels read the result
    (``nvfp4_moe_forward_triton(..., tiled=True)``): dequantizing it as a row-major tensor is wrong."""
    from nvfp4stack.formats.nvfp4 import Nvfp4Tensor

    return (Nvfp4Tensor(to_tiles(w13.data, True, "w13"), w13.scale, w13.global_scale, w13.shape),
            Nvfp4Tensor(to_tiles(w2.data, False, "w2"), w2.scale, w2.global_scale, w2.shape))
