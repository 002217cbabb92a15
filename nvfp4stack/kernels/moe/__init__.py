"""MoE backends, one per file; importing this package registers them all."""
from nvfp4stack.kernels.moe import (  # noqa: F401
    cutlass, deep_gemm, flashinfer_cutedsl, flashinfer_cutlass, flashinfer_trtllm, humming,
    marlin, vllm_emulation,
)
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe, torch_twin  # noqa: F401
