"""NVFP4 storage (modelopt export): ``weight`` packed E2M1 [..., N, K/2], ``weight_scale`` UE4M3
[..., N, K/16], ``weight_scale_2`` fp32 global, ``input_scale`` fp32 activation scale (W4A4)."""
from __future__ import annotations

import math
from typing import Mapping

import torch

from nvfp4stack.formats.codec import CODECS, Codec, Entry, batches, require
from nvfp4stack.formats.nvfp4 import BLOCK, dequantize_nvfp4, quantize_nvfp4


@CODECS.register("nvfp4")
class Nvfp4Codec(Codec):
    suffixes = ("weight", "weight_scale", "weight_scale_2", "input_scale")
    packed = True
    bits_per_weight = 4 + 8 / BLOCK
    detect_order = 10   # its weight_scale + U8 weight would otherwise look like other packed formats

    @classmethod
    def detect(cls, entries: Mapping[str, Entry]) -> bool:
        # The global scales exist in no other format; a lost weight still leaves them to tell.
        w = entries.get("weight")
        packed = w is not None and w.dtype == "U8"
        return ("weight_scale_2" in entries or ("input_scale" in entries and (w is None or packed))
                or ("weight_scale" in entries and packed))

    @classmethod
    def stored_bytes(cls, shape: tuple[int, ...], dtype: str = "bf16", fp8_ue8m0: bool = True) -> int:
        n = math.prod(shape)
        # E2M1 + UE4M3 per 16 + weight_scale_2 and input_scale (fp32) per stacked matrix
        return n // 2 + n // BLOCK + 2 * 4 * batches(shape)

    @classmethod
    def dequantize(cls, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        require(tensors, ("weight", "weight_scale", "weight_scale_2"), name, "NVFP4")
        return dequantize_nvfp4(tensors["weight"].view(torch.uint8), tensors["weight_scale"],
                                tensors["weight_scale_2"], torch.float32)

    @classmethod
    def emulate(cls, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> torch.Tensor:
        return quantize_nvfp4(w, global_scale, name=name).dequantize(torch.float32)
