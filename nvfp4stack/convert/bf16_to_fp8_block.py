"""BF16 -> FP8 block (DeepGEMM recipe, UE8M0 scales by default)."""
from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import fp8_to_group, high_precision_weight
from nvfp4stack.formats.fp8_block import quantize_fp8_block
from nvfp4stack.schemes import Scheme


@CONVERTERS.register("bf16_to_fp8_block")
class Bf16ToFp8Block(Converter):
    source, target = Scheme.BF16, Scheme.FP8_BLOCK

    def __init__(self, ue8m0: bool = True, scale_key: str = "scale"):
        self.ue8m0, self.scale_key = ue8m0, scale_key

    def convert(self, tensors: dict, name: str) -> dict:
        w = high_precision_weight(tensors, name)
        return fp8_to_group(quantize_fp8_block(w, self.ue8m0, name=f"{name}.weight"), self.scale_key)
