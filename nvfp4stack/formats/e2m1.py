"""E2M1 (FP4) codes: the 16 values, round-to-nearest-even encoding, nibble packing.

Bit-exact with modelopt ``NVFP4QTensor._cast_fp4`` (sign bit 3, magnitude index bits 0-2).
"""
from __future__ import annotations

import torch

# Index = 4-bit code. Code 8 is negative zero: vLLM's ``break_fp4_bytes`` decodes it as -0.0,
# modelopt's table as +0.0; both compare equal, -0.0 keeps the sign bit that the code carries.
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float32,
)
E2M1_MAX = 6.0

# Rounding thresholds between consecutive magnitudes. At an exact midpoint the result must be
# the neighbour with an even code: below 0.25/1.25/2.5/5 the lower code is even, so those
# thresholds are strict (>); at 0.75/1.75/3.5 the upper code is even, so they are inclusive (>=).
_THRESHOLDS = ((0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))

_values_on: dict[torch.device, torch.Tensor] = {}


def e2m1_values(device: torch.device | str) -> torch.Tensor:
    """E2M1_VALUES on ``device`` (cached)."""
    device = torch.device(device)
    if device not in _values_on:
        _values_on[device] = E2M1_VALUES.to(device)
    return _values_on[device]


def _encode_by_thresholds(y: torch.Tensor) -> torch.Tensor:
    """The rounding rule, written out: modelopt's searchsorted + odd-bound tie fix."""
    a = y.abs()
    code = (a > 0.25).to(torch.uint8)
    for t, inclusive in _THRESHOLDS:
        code += (a >= t) if inclusive else (a > t)
    code |= (y < 0).to(torch.uint8) << 3
    return code


def _build_lut() -> torch.Tensor:
    # Every threshold has its low 21 mantissa bits zero, so an fp32 value's code depends only on
    # its top 11 bits (sign, exponent, 2 mantissa bits) and on whether the low 21 bits are zero
    # (value exactly on a bucket's lower edge, which is where the ties sit). One representative
    # per (bucket, on-edge) pair, rounded by the rule above, gives a 4096-entry table.
    idx = torch.arange(4096, dtype=torch.int64)
    bits = ((idx >> 1) << 21) | (1 - (idx & 1))
    rep = bits.to(torch.int32).view(torch.float32)
    return _encode_by_thresholds(torch.nan_to_num(rep, nan=0.0))


_LUT = _build_lut()
_lut_on: dict[torch.device, torch.Tensor] = {}


def e2m1_encode(y: torch.Tensor) -> torch.Tensor:
    """Round already-scaled fp32 values to E2M1 codes (uint8, same shape).

    Ties to even, saturation at +-6, sign bit for every negative input (so a small negative
    becomes code 8, -0), while a -0.0 input stays code 0 exactly as modelopt does.
    """
    if y.dtype != torch.float32:
        raise ValueError(f"e2m1_encode: expected float32 scaled values, found {y.dtype}")
    if y.device not in _lut_on:
        _lut_on[y.device] = _LUT.to(y.device)
    b = y.contiguous().view(torch.int32)
    idx = (b >> 20).bitwise_and_(0xFFE).bitwise_or_((b & 0x1FFFFF) == 0)
    # index_select takes int32 indices and is ~4x faster on CPU than advanced indexing
    return _lut_on[y.device].index_select(0, idx.reshape(-1)).reshape(y.shape)


_CHUNK_ELEMS = 1 << 17

# Packing table: code c stored as c | c << 4, indexed by ``_pack_index`` (the bucket index with
# "strictly inside the bucket" as its low bit, i.e. ``_build_lut``'s index with bit 0 flipped).
_PACK_LUT = (_LUT * 17)[torch.arange(4096) ^ 1]
_pack_lut_on: dict[torch.device, torch.Tensor] = {}


def _pack_index(y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``_PACK_LUT`` index of fp32 ``y`` into int32 ``idx``; destroys ``y``. With f = bits >> 21
    and c = (bits + 2^21 - 1) >> 21 (floor and ceil of bits / 2^21), f + c = 2f + (low 21 bits
    != 0): five in-place integer passes, no bool temporaries or dtype conversions."""
    b = y.view(torch.int32)
    torch.add(b, 0x1FFFFF, out=idx).bitwise_right_shift_(21)   # no overflow: NaN bits never get here
    return idx.add_(b.bitwise_right_shift_(21)).bitwise_and_(0xFFF)


def encode_packed(xb: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """Packed codes of ``xb / divisor``: xb [R, nb, B] (any float), divisor fp32 [R, nb, 1]
    -> uint8 [R, nb*B/2]. On CPU, row chunks through reused buffers keep every temporary in
    cache and avoid fresh pages per op (~2x)."""
    rows, k = xb.shape[0], xb.shape[1] * xb.shape[2]
    dev = xb.device
    if dev not in _pack_lut_on:
        _pack_lut_on[dev] = _PACK_LUT.to(dev)
    lut = _pack_lut_on[dev]
    out = torch.empty((rows, k // 2), dtype=torch.uint8, device=dev)
    step = max(1, rows if xb.is_cuda else _CHUNK_ELEMS // k)
    y = torch.empty((min(step, rows), *xb.shape[1:]), dtype=torch.float32, device=dev)
    idx = torch.empty(y.shape, dtype=torch.int32, device=dev)
    twin = torch.empty(y.numel(), dtype=torch.uint8, device=dev)       # c | c << 4 per value
    for r in range(0, rows, step):
        n = min(step, rows - r)
        yn = torch.div(xb[r:r + n], divisor[r:r + n], out=y[:n])       # fp32, modelopt's x.float()/d
        t = torch.index_select(lut, 0, _pack_index(yn, idx[:n]).view(-1), out=twin[:n * k])
        # int16 word = twin(even) | twin(odd) << 8 (little-endian); >> 4 leaves c_even | c_odd << 4
        # in its low byte, the sign-filled high byte is dropped by taking every other byte
        t.view(torch.int16).bitwise_right_shift_(4)
        out[r:r + n] = t.view(n, k)[:, 0::2]
    return out


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8) -> fp32 values."""
    return e2m1_values(codes.device).index_select(0, codes.reshape(-1).int()).reshape(codes.shape)


_pair_on: dict[torch.device, torch.Tensor] = {}


def decode_packed(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> fp32 values [..., K] in one table lookup per byte (no unpack step)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"decode_packed: expected packed uint8, found {packed.dtype}")
    dev = packed.device
    if dev not in _pair_on:
        byte = torch.arange(256)
        _pair_on[dev] = torch.stack((E2M1_VALUES[byte & 0x0F], E2M1_VALUES[byte >> 4]), -1).to(dev)
    vals = _pair_on[dev].index_select(0, packed.reshape(-1).int())      # [numel, 2] low nibble first
    return vals.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] -> uint8 [..., K/2], even element in the low nibble."""
    if codes.dtype != torch.uint8 or codes.shape[-1] % 2:
        raise ValueError(
            f"pack_e2m1: expected uint8 codes with an even last dimension, found {codes.dtype} "
            f"{tuple(codes.shape)}; pad the last dimension to a multiple of 2"
        )
    return (codes[..., 1::2] << 4) | codes[..., 0::2]


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K] (low nibble is the even element)."""
    if packed.dtype != torch.uint8:
        raise ValueError(
            f"unpack_e2m1: expected packed uint8, found {packed.dtype}; "
            "view int8/float4_e2m1fn_x2 checkpoint data as torch.uint8 first"
        )
    out = torch.stack((packed & 0x0F, packed >> 4), dim=-1)  # [..., K/2, 2]
    return out.flatten(-2)
