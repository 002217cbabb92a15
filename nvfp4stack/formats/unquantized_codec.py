"""Unquantized storage: ``bf16`` (a float weight, 2 bytes each once converted; BF16, F16 or F32 as
stored) and ``passthrough`` (kept byte for byte at its own dtype's size; never detected: a group no
codec claims passes through)."""
from __future__ import annotations

import math
from typing import Mapping

import torch

from nvfp4stack.formats.codec import CODECS, Codec, Entry, require

FLOAT_DTYPES = ("BF16", "F16", "F32")
DTYPE_BYTES = {"bf16": 2, "f32": 4, "i64": 8, "i32": 4}   # logical dtype of a tensor kept as stored


@CODECS.register("bf16")
class Bf16Codec(Codec):
    bits_per_weight = 16
    detect_order = 90

    @classmethod
    def detect(cls, entries: Mapping[str, Entry]) -> bool:
        w = entries.get("weight")
        return w is not None and w.dtype in FLOAT_DTYPES

    @classmethod
    def stored_bytes(cls, shape: tuple[int, ...], dtype: str = "bf16", fp8_ue8m0: bool = True) -> int:
        return math.prod(shape) * 2

    @classmethod
    def dequantize(cls, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        require(tensors, ("weight",), name, "bf16")
        return tensors["weight"].float()

    @classmethod
    def emulate(cls, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> torch.Tensor:
        return w.to(torch.bfloat16)

    @classmethod
    def describe(cls, entries: Mapping[str, Entry]) -> str:
        return entries["weight"].dtype.lower() if "weight" in entries else cls.name


@CODECS.register("passthrough")
class PassthroughCodec(Codec):
    bits_per_weight = 16

    @classmethod
    def stored_bytes(cls, shape: tuple[int, ...], dtype: str = "bf16", fp8_ue8m0: bool = True) -> int:
        return math.prod(shape) * DTYPE_BYTES.get(dtype, 2)

    @classmethod
    def dequantize(cls, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        require(tensors, ("weight",), name, "stored")
        return tensors["weight"].float()

    @classmethod
    def emulate(cls, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> torch.Tensor:
        return w
