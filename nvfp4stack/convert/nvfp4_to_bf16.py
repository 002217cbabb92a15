"""NVFP4 -> BF16 (e.g. attention projections vLLM must read unquantized)."""
from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import nvfp4_from_group
from nvfp4stack.schemes import Scheme


@CONVERTERS.register("nvfp4_to_bf16")
class Nvfp4ToBf16(Converter):
    source, target = Scheme.NVFP4, Scheme.BF16

    def convert(self, tensors: dict, name: str) -> dict:
        # input_scale only matters to an NVFP4 activation path; a BF16 layer has none.
        self.report = {"consumed": sorted(set(tensors) - {"weight", "weight_scale", "weight_scale_2"})}
        return {"weight": nvfp4_from_group(tensors, name).dequantize()}
