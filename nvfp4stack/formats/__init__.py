"""Bit-exact number formats: NVFP4, MXFP4, FP8 block (pure torch, CPU and CUDA)."""
from nvfp4stack.formats.e2m1 import E2M1_VALUES, e2m1_decode, e2m1_encode, pack_e2m1, unpack_e2m1
from nvfp4stack.formats.fp8_block import Fp8BlockTensor, dequantize_fp8_block, quantize_fp8_block
from nvfp4stack.formats.mxfp4 import Mxfp4Tensor, as_ue8m0_bytes, dequantize_mxfp4, quantize_mxfp4, ue8m0_to_float
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor, dequantize_nvfp4, quantize_nvfp4, quantize_nvfp4_activation

__all__ = [
    "E2M1_VALUES", "e2m1_encode", "e2m1_decode", "pack_e2m1", "unpack_e2m1",
    "Nvfp4Tensor", "quantize_nvfp4", "dequantize_nvfp4", "quantize_nvfp4_activation",
    "Mxfp4Tensor", "quantize_mxfp4", "dequantize_mxfp4", "ue8m0_to_float", "as_ue8m0_bytes",
    "Fp8BlockTensor", "quantize_fp8_block", "dequantize_fp8_block",
]
