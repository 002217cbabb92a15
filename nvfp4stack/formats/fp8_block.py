"""FP8 block: E4M3 values with one scale per 128x128 block (UE8M0 power of two, or fp32).

The recipe is DeepGEMM's ``per_block_cast_to_fp8`` (vLLM carries the same code as
``vllm.utils.deep_gemm.per_block_cast_to_fp8``): zero-pad to whole blocks, ``sf = max(amax,
1e-4) / 448``, rounded up to a power of two when ``ue8m0``, ``q = (x * (1 / sf)).to(e4m3)``.
Shapes that are not whole blocks are padded for the scale computation, exactly like DeepGEMM, so
the scale grid is [ceil(N/128), ceil(K/128)]. UE8M0 scales are kept as their exponent byte.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4stack.formats.mxfp4 import as_ue8m0_bytes, ue8m0_to_float

E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4  # DeepGEMM's clamp: keeps the scale of an all-zero block finite


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Fp8BlockTensor:
    """data: float8_e4m3fn [N, K]; scale: uint8 UE8M0 (ue8m0=True) or float32 [ceil(N/bn),
    ceil(K/bk)]."""

    data: torch.Tensor
    scale: torch.Tensor
    ue8m0: bool
    shape: tuple
    block: tuple = (128, 128)

    def __post_init__(self):
        self.shape, self.block = tuple(self.shape), tuple(self.block)
        if self.data.dtype != torch.float8_e4m3fn:
            raise ValueError(f"Fp8BlockTensor.data: expected float8_e4m3fn, found {self.data.dtype}")
        if len(self.shape) != 2 or tuple(self.data.shape) != self.shape:
            raise ValueError(f"Fp8BlockTensor.data: expected 2-D shape {self.shape}, found "
                             f"{tuple(self.data.shape)}")
        want = torch.uint8 if self.ue8m0 else torch.float32
        if self.scale.dtype != want:
            raise ValueError(f"Fp8BlockTensor.scale: ue8m0={self.ue8m0} expects {want}, found "
                             f"{self.scale.dtype}; use as_ue8m0_bytes() for float8_e8m0fnu "
                             "scales or set ue8m0 to match the checkpoint")
        grid = (_cdiv(self.shape[0], self.block[0]), _cdiv(self.shape[1], self.block[1]))
        if tuple(self.scale.shape) != grid:
            raise ValueError(f"Fp8BlockTensor.scale: expected shape {grid} for {self.shape} with "
                             f"blocks {self.block}, found {tuple(self.scale.shape)}")

    def scale_float(self) -> torch.Tensor:
        return ue8m0_to_float(self.scale) if self.ue8m0 else self.scale

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return dequantize_fp8_block(self.data, self.scale_float(), dtype, self.block)

    @property
    def nbytes(self) -> int:
        return self.data.numel() + self.scale.numel() * self.scale.element_size()


def quantize_fp8_block(x: torch.Tensor, ue8m0: bool = True, block: tuple = (128, 128), *,
                       name: str = "tensor") -> Fp8BlockTensor:
    """Quantize a 2-D ``x`` [N, K] to E4M3 with per-block scales (DeepGEMM recipe)."""
    if x.ndim != 2 or not x.is_floating_point() or x.dtype.itemsize == 1:
        raise ValueError(f"{name}: expected a 2-D bf16/fp16/fp32 tensor, found {x.dtype} "
                         f"{tuple(x.shape)}; quantize stacked experts one at a time")
    (n, k), (bn, bk) = x.shape, block
    gn, gk = _cdiv(n, bn), _cdiv(k, bk)
    if (gn * bn, gk * bk) != (n, k):  # zero padding never raises a block's amax
        x = torch.nn.functional.pad(x, (0, gk * bk - k, 0, gn * bn - n))
    xv = x.view(gn, bn, gk, bk)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True)
    if not torch.isfinite(amax).all():
        raise ValueError(f"{name}: contains NaN or Inf; FP8 block scaling cannot encode them")
    sf = amax.clamp(min=AMAX_FLOOR) / E4M3_MAX
    if ue8m0:
        sf = torch.pow(2.0, torch.ceil(torch.log2(sf.abs())))
    q = (xv * (1.0 / sf)).to(torch.float8_e4m3fn).view(gn * bn, gk * bk)[:n, :k].contiguous()
    sf = sf.view(gn, gk)
    # A power of two's float32 exponent field is exactly its UE8M0 byte.
    scale = ((sf.view(torch.int32) >> 23) & 0xFF).to(torch.uint8) if ue8m0 else sf.contiguous()
    return Fp8BlockTensor(q, scale, ue8m0, (n, k), (bn, bk))


def dequantize_fp8_block(data: torch.Tensor, scale: torch.Tensor,
                         dtype: torch.dtype = torch.bfloat16, block: tuple = (128, 128)) -> torch.Tensor:
    """``data * scale`` per block in fp32, cast once. ``scale`` fp32, or UE8M0 bytes/e8m0."""
    if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        scale = ue8m0_to_float(as_ue8m0_bytes(scale))
    n, k = data.shape
    full = scale.float().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    return (data.float() * full).to(dtype)
