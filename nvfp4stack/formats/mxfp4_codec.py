"""MXFP4 storage (the release format): ``weight`` packed E2M1 (uint8/int8) [..., N, K/2] and
``scale`` UE8M0 [..., N, K/32] (some exports call it ``scales``)."""
from __future__ import annotations

import math
from typing import Mapping

import torch

from nvfp4stack.formats.codec import CODECS, Codec, Entry, require
from nvfp4stack.formats.mxfp4 import BLOCK, as_ue8m0_bytes, dequantize_mxfp4, quantize_mxfp4

SCALE_KEYS = ("scale", "scales")


@CODECS.register("mxfp4")
class Mxfp4Codec(Codec):
    suffixes = ("weight", *SCALE_KEYS)
    packed = True
    bits_per_weight = 4 + 8 / BLOCK
    detect_order = 20

    @classmethod
    def detect(cls, entries: Mapping[str, Entry]) -> bool:
        w = entries.get("weight")
        return w is not None and w.dtype in ("U8", "I8") and any(k in entries for k in SCALE_KEYS)

    @classmethod
    def stored_bytes(cls, shape: tuple[int, ...], dtype: str = "bf16", fp8_ue8m0: bool = True) -> int:
        n = math.prod(shape)
        return n // 2 + n // BLOCK

    @classmethod
    def dequantize(cls, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        key = next((k for k in SCALE_KEYS if k in tensors), SCALE_KEYS[0])
        require(tensors, ("weight", key), name, "MXFP4")
        return dequantize_mxfp4(tensors["weight"].view(torch.uint8),
                                as_ue8m0_bytes(tensors[key], f"{name}.{key}"), torch.float32)

    @classmethod
    def emulate(cls, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> torch.Tensor:
        return quantize_mxfp4(w, name=name).dequantize(torch.float32)
