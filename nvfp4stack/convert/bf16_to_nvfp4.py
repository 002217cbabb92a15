"""BF16 -> NVFP4, weight-only (data-free); ``input_scale`` kept when calibration provided it."""
from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import high_precision_weight, input_scale_of, nvfp4_to_group
from nvfp4stack.formats.nvfp4 import quantize_nvfp4
from nvfp4stack.schemes import Scheme


@CONVERTERS.register("bf16_to_nvfp4")
class Bf16ToNvfp4(Converter):
    source, target = Scheme.BF16, Scheme.NVFP4

    def convert(self, tensors: dict, name: str) -> dict:
        q = quantize_nvfp4(high_precision_weight(tensors, name), name=f"{name}.weight")
        return nvfp4_to_group(q, input_scale_of(tensors))
