"""FP8 block storage: ``weight`` E4M3 [N, K] and one scale per 128x128 block, UE8M0 bytes or fp32,
as ``scale`` (the release layout) or ``weight_scale_inv`` (HF FP8 exports)."""
from __future__ import annotations

import math
from typing import Mapping

import torch

from nvfp4stack.formats.codec import CODECS, Codec, Entry, batches, require
from nvfp4stack.formats.fp8_block import dequantize_fp8_block, quantize_fp8_block

SCALE_KEYS = ("scale", "weight_scale_inv")
BLOCK = 128


@CODECS.register("fp8_block")
class Fp8BlockCodec(Codec):
    suffixes = ("weight", *SCALE_KEYS)
    bits_per_weight = 8 + 32 / (BLOCK * BLOCK)
    detect_order = 30

    @classmethod
    def detect(cls, entries: Mapping[str, Entry]) -> bool:
        w = entries.get("weight")
        return w is not None and w.dtype.startswith("F8")

    @classmethod
    def stored_bytes(cls, shape: tuple[int, ...], dtype: str = "bf16", fp8_ue8m0: bool = True) -> int:
        n = math.prod(shape)
        rows, cols = shape[-2:]
        blocks = batches(shape) * math.ceil(rows / BLOCK) * math.ceil(cols / BLOCK)
        return n + blocks * (1 if fp8_ue8m0 else 4)

    @classmethod
    def dequantize(cls, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        key = next((k for k in SCALE_KEYS if k in tensors), SCALE_KEYS[0])
        require(tensors, ("weight", key), name, "FP8 block")
        return dequantize_fp8_block(tensors["weight"], tensors[key], torch.float32)

    @classmethod
    def emulate(cls, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> torch.Tensor:
        return quantize_fp8_block(w, ue8m0=True, name=name).dequantize(torch.float32)
