"""NVFP4 -> FP8 block (e.g. an attention projection read directly by DeepGEMM's FP8 einsum)."""
import torch

from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import fp8_to_group, nvfp4_from_group
from nvfp4stack.formats.fp8_block import quantize_fp8_block
from nvfp4stack.schemes import Scheme


@CONVERTERS.register("nvfp4_to_fp8_block")
class Nvfp4ToFp8Block(Converter):
    source, target = Scheme.NVFP4, Scheme.FP8_BLOCK

    def __init__(self, ue8m0: bool = True, scale_key: str = "scale"):
        self.ue8m0, self.scale_key = ue8m0, scale_key

    def convert(self, tensors: dict, name: str) -> dict:
        # fp32 in between: one rounding (to E4M3), not two (via bf16)
        w = nvfp4_from_group(tensors, name).dequantize(torch.float32)
        self.report = {"consumed": sorted(set(tensors) - {"weight", "weight_scale", "weight_scale_2"})}
        return fp8_to_group(quantize_fp8_block(w, self.ue8m0, name=f"{name}.weight"), self.scale_key)
