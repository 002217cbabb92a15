"""MXFP4: E2M1 values with one UE8M0 (power-of-two) scale per 32 along K.

This is the release format of the flagship's routed experts: ``weight`` packed E2M1 (even element
in the low nibble, stored as int8/uint8) [N, K/2] and ``scale`` float8_e8m0fnu [N, K/32]; vLLM
reads the scale bytes raw (``_dequant_mxfp4_ue8m0_gran32``). Scale choice is modelopt's
``MXFP4QTensor``: ``e = ceil(max(log2(amax/6), -127))``. Codes round to nearest, ties to even,
saturating at 6 (the OCP MX rule and the hardware cvt.rn); modelopt's MXFP4 reference instead
rounds ties toward zero and encodes 0 as -0: tests pin exactly that difference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4stack.formats.amax import block_amax
from nvfp4stack.formats.e2m1 import E2M1_MAX, decode_packed, encode_packed

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 255


def ue8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8 or float8_e8m0fnu) -> fp32 powers of two (byte 0 -> 2^-127)."""
    return scale.view(torch.float8_e8m0fnu).float()


def as_ue8m0_bytes(scale: torch.Tensor, name: str = "scale") -> torch.Tensor:
    """Checkpoint UE8M0 scale (float8_e8m0fnu or uint8) -> uint8 bytes, never a numeric cast."""
    if scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
        return scale.view(torch.uint8)
    raise ValueError(f"{name}: expected UE8M0 scale bytes (float8_e8m0fnu or uint8), found "
                     f"{scale.dtype}; a float8_e4m3fn scale is NVFP4 (UE4M3), a float32 one is "
                     "FP8-block with fp32 scales")


@dataclass
class Mxfp4Tensor:
    """data: uint8 [..., K/2] packed E2M1; scale: uint8 UE8M0 [..., K/32]; shape [..., K]."""

    data: torch.Tensor
    scale: torch.Tensor
    shape: tuple

    def __post_init__(self):
        self.shape = tuple(self.shape)
        if self.data.dtype != torch.uint8:
            raise ValueError(f"Mxfp4Tensor.data: expected uint8 packed E2M1, found "
                             f"{self.data.dtype}; view int8/float4_e2m1fn_x2 data as uint8")
        if self.scale.dtype != torch.uint8:
            raise ValueError(f"Mxfp4Tensor.scale: expected uint8 UE8M0 bytes, found "
                             f"{self.scale.dtype}; use as_ue8m0_bytes() for float8_e8m0fnu "
                             "(a float8_e4m3fn scale means the tensor is NVFP4, not MXFP4)")
        if not self.shape or self.shape[-1] % BLOCK:
            raise ValueError(f"Mxfp4Tensor.shape: expected [..., K] with K % {BLOCK} == 0, "
                             f"found {self.shape}")
        lead, k = self.shape[:-1], self.shape[-1]
        if tuple(self.data.shape) != (*lead, k // 2):
            raise ValueError(f"Mxfp4Tensor.data: expected shape {(*lead, k // 2)}, found "
                             f"{tuple(self.data.shape)}")
        if tuple(self.scale.shape) != (*lead, k // BLOCK):
            raise ValueError(f"Mxfp4Tensor.scale: expected shape {(*lead, k // BLOCK)} (one per "
                             f"{BLOCK}), found {tuple(self.scale.shape)}")
        if not self.scale.is_meta and (self.scale == E8M0_NAN).any():  # meta: output specs only
            raise ValueError("Mxfp4Tensor.scale: contains byte 255 (UE8M0 NaN); the checkpoint "
                             "scale is corrupt or is not UE8M0")

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return dequantize_mxfp4(self.data, self.scale, dtype)

    @property
    def nbytes(self) -> int:
        return self.data.numel() + self.scale.numel()


def quantize_mxfp4(x: torch.Tensor, *, name: str = "tensor") -> Mxfp4Tensor:
    """Quantize ``x`` [..., K] (K % 32 == 0, else rejected) to MXFP4."""
    if not x.is_floating_point() or x.dtype.itemsize == 1:
        raise ValueError(f"{name}: expected a bf16/fp16/fp32 tensor to quantize, found {x.dtype}")
    if x.ndim < 1 or x.shape[-1] % BLOCK:
        raise ValueError(f"{name}: expected last dimension a multiple of {BLOCK} (MXFP4 block), "
                         f"found shape {tuple(x.shape)}; pad K with zeros first")
    xb = x.reshape(*x.shape[:-1], -1, BLOCK)                            # [..., K/32, 32]
    amax = block_amax(x, BLOCK, name, "MXFP4")                           # fp32 [..., K/32]
    # modelopt MXFP4QTensor.quantize: smallest power of two with amax/2^e <= 6; zero -> 2^-127.
    e = torch.ceil(torch.clamp(torch.log2(amax / E2M1_MAX), min=-float(E8M0_BIAS)))
    k = x.shape[-1]
    data = encode_packed(xb.reshape(-1, k // BLOCK, BLOCK), torch.exp2(e).reshape(-1, k // BLOCK, 1))
    return Mxfp4Tensor(data.reshape(*x.shape[:-1], k // 2), (e + E8M0_BIAS).to(torch.uint8), tuple(x.shape))


def dequantize_mxfp4(data: torch.Tensor, scale: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``e2m1 * 2^(byte-127)`` in fp32, cast once to ``dtype``."""
    vals = decode_packed(data)                                           # fp32 [..., K]
    shape = vals.shape
    vals = vals.reshape(*shape[:-1], -1, BLOCK)
    return (vals * ue8m0_to_float(scale).unsqueeze(-1)).reshape(shape).to(dtype)
