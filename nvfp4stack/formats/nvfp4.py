"""NVFP4: E2M1 values, UE4M3 scale per 16 along K, fp32 global scale.

Numerics follow modelopt ``NVFP4QTensor`` (qtensor/nvfp4_tensor.py) operation for operation so
results are bit-identical: ``s2 = amax / 2688``; ``bs = amax_block / (6 * s2)``, zero -> 1.0,
clamp [2^-9, 448], cast to e4m3 (RNE); ``y = x / (bs * s2)``; E2M1 ties to even.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4stack.formats.amax import block_amax
from nvfp4stack.formats.e2m1 import E2M1_MAX, decode_packed, encode_packed

BLOCK = 16
E4M3_MAX = 448.0
GLOBAL_DIVISOR = E2M1_MAX * E4M3_MAX  # 2688: maps amax onto the largest code x largest scale
SCALE_MIN = 2.0**-9  # smallest e4m3 subnormal; modelopt clamps block scales here


@dataclass
class Nvfp4Tensor:
    """A quantized NVFP4 tensor of logical ``shape`` [..., N, K] (K a multiple of 16).

    data: uint8 [..., N, K/2]; scale: float8_e4m3fn [..., N, K/16]; global_scale: float32,
    0-dim or [E] for stacked experts [E, N, K].
    """

    data: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor
    shape: tuple

    def __post_init__(self):
        self.shape = tuple(self.shape)
        where = "Nvfp4Tensor"
        if self.data.dtype != torch.uint8:
            raise ValueError(f"{where}.data: expected uint8 packed E2M1, found {self.data.dtype}; "
                             "view int8/float4_e2m1fn_x2 data as torch.uint8")
        if self.scale.dtype != torch.float8_e4m3fn:
            hint = (" (uint8/e8m0 bytes are UE8M0 MXFP4/FP8-block scales, not UE4M3: convert with "
                    "mxfp4_to_nvfp4 instead of reinterpreting)"
                    if self.scale.dtype in (torch.uint8, torch.float8_e8m0fnu) else "")
            raise ValueError(f"{where}.scale: expected float8_e4m3fn (UE4M3) block scales, found "
                             f"{self.scale.dtype}{hint}")
        if self.global_scale.dtype != torch.float32:
            raise ValueError(f"{where}.global_scale: expected float32, found "
                             f"{self.global_scale.dtype}; cast with .float()")
        if len(self.shape) < 2 or self.shape[-1] % BLOCK:
            raise ValueError(f"{where}.shape: expected [..., N, K] with K % {BLOCK} == 0, found "
                             f"{self.shape}")
        lead, k = self.shape[:-1], self.shape[-1]
        if tuple(self.data.shape) != (*lead, k // 2):
            raise ValueError(f"{where}.data: expected shape {(*lead, k // 2)} for logical shape "
                             f"{self.shape}, found {tuple(self.data.shape)}")
        if tuple(self.scale.shape) != (*lead, k // BLOCK):
            raise ValueError(f"{where}.scale: expected shape {(*lead, k // BLOCK)} (one per "
                             f"{BLOCK} along K), found {tuple(self.scale.shape)}")
        gs = self.global_scale
        if gs.ndim not in (0, 1) or (gs.ndim == 1 and (len(self.shape) != 3 or gs.shape[0] != self.shape[0])):
            raise ValueError(f"{where}.global_scale: expected a 0-dim tensor, or [E] for a stacked "
                             f"[E, N, K] tensor, found shape {tuple(gs.shape)} for logical shape "
                             f"{self.shape}")

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return dequantize_nvfp4(self.data, self.scale, self.global_scale, dtype)

    @property
    def nbytes(self) -> int:
        return self.data.numel() + self.scale.numel() + 4 * self.global_scale.numel()


def _check_input(x: torch.Tensor, name: str) -> None:
    if not x.is_floating_point() or x.dtype.itemsize == 1:
        raise ValueError(f"{name}: expected a bf16/fp16/fp32 tensor to quantize, found {x.dtype}")
    if x.ndim < 2 or x.shape[-1] % BLOCK:
        raise ValueError(f"{name}: expected shape [..., N, K] with K a multiple of {BLOCK} (NVFP4 "
                         f"block), found {tuple(x.shape)}; pad K with zeros first")


def _expand_global(gs: torch.Tensor, ndim: int) -> torch.Tensor:
    """[E] or 0-dim -> broadcastable against [..., N, K/16] block tensors."""
    return gs.reshape(-1, *([1] * (ndim - 1))) if gs.ndim == 1 else gs


def nvfp4_block_amax(x: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """fp32 amax per 16-block [..., N, K/16]; raises on NaN/Inf anywhere in ``x``."""
    return block_amax(x, BLOCK, name, "NVFP4")


def nvfp4_global_scale(x: torch.Tensor, name: str = "tensor", *, block_amax=None) -> torch.Tensor:
    """``amax / 2688`` as float32: 0-dim for 2-D input, [E] per expert for 3-D [E, N, K]."""
    bamax = nvfp4_block_amax(x, name) if block_amax is None else block_amax
    amax = bamax.flatten(1).amax(1) if x.ndim == 3 else bamax.amax()
    return amax / GLOBAL_DIVISOR


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | float | None = None, *,
                   name: str = "tensor") -> Nvfp4Tensor:
    """Quantize ``x`` [..., N, K] to NVFP4 exactly as modelopt does.

    global_scale None -> amax/2688 (per expert [E] for 3-D input). An all-zero tensor (modelopt
    would divide 0 by 0 and emit NaN scales) gets global_scale 1.0, so it round-trips to zeros.
    """
    _check_input(x, name)
    bamax = nvfp4_block_amax(x, name)                                   # [..., N, K/16]
    if global_scale is None:
        gs = nvfp4_global_scale(x, name, block_amax=bamax)
        gs = torch.where(gs == 0, torch.ones_like(gs), gs)
    else:
        gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
        if not (torch.isfinite(gs).all() and (gs > 0).all()):
            raise ValueError(f"{name}: global_scale must be finite and > 0, found {gs.tolist()}; "
                             "pass None to derive it from the tensor's amax")
    gsb = _expand_global(gs, x.ndim)
    bs = bamax / (E2M1_MAX * gsb)
    bs = torch.where(bs == 0, torch.ones_like(bs), bs)
    scale = bs.clamp(min=SCALE_MIN, max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = scale.float() * gsb                                          # [..., N, K/16]
    k = x.shape[-1]
    data = encode_packed(x.reshape(-1, k // BLOCK, BLOCK), denom.reshape(-1, k // BLOCK, 1))
    return Nvfp4Tensor(data.reshape(*x.shape[:-1], k // 2), scale, gs, tuple(x.shape))


def quantize_nvfp4_activation(x: torch.Tensor, input_scale: torch.Tensor | float, *,
                              name: str = "activation") -> Nvfp4Tensor:
    """W4A4 activation emulation: static global ``input_scale`` (= act_amax/2688), dynamic
    block scales; values beyond the calibrated range saturate at the largest code/scale."""
    return quantize_nvfp4(x, global_scale=input_scale, name=name)


def fake_quantize_nvfp4_activation(x: torch.Tensor, input_scale: torch.Tensor | float, *,
                                   name: str = "activation", dtype: torch.dtype | None = None) -> torch.Tensor:
    """modelopt's W4A4 fake quant: NVFP4 quantize-dequantize round trip, returned in ``dtype``
    (default ``x.dtype``)."""
    q = quantize_nvfp4_activation(x, input_scale, name=name)
    return q.dequantize(torch.float32).to(dtype or x.dtype)


def dequantize_nvfp4(data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor,
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``e2m1 * (scale * global_scale)`` in fp32, cast once to ``dtype`` (modelopt's and vLLM's
    ``dequantize_to_dtype`` order of operations)."""
    vals = decode_packed(data)                                           # fp32 [..., N, K]
    shape = vals.shape
    vals = vals.reshape(*shape[:-1], -1, BLOCK)
    block = scale.float() * _expand_global(global_scale.float(), scale.ndim)  # [..., N, K/16]
    return (vals * block.unsqueeze(-1)).reshape(shape).to(dtype)
