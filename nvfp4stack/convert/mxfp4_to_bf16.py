"""MXFP4 -> BF16 (e.g. a release's MXFP4 experts as the BF16 reference of an experiment).

Exact: every MXFP4 value (E2M1 x 2^k) is representable in BF16.
"""
from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import mxfp4_from_group
from nvfp4stack.schemes import Scheme


@CONVERTERS.register("mxfp4_to_bf16")
class Mxfp4ToBf16(Converter):
    source, target = Scheme.MXFP4, Scheme.BF16

    def convert(self, tensors: dict, name: str) -> dict:
        self.report = {"consumed": sorted(set(tensors) - {"weight", "scale", "scales"})}
        return {"weight": mxfp4_from_group(tensors, name).dequantize()}
