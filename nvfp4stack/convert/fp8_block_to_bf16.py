"""FP8 block (UE8M0 or fp32 scales) -> BF16."""
from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import fp8_from_group
from nvfp4stack.schemes import Scheme


@CONVERTERS.register("fp8_block_to_bf16")
class Fp8BlockToBf16(Converter):
    source, target = Scheme.FP8_BLOCK, Scheme.BF16

    def convert(self, tensors: dict, name: str) -> dict:
        return {"weight": fp8_from_group(tensors, name).dequantize()}
