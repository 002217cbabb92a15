"""MoE backends, one per file; importing this package registers them all."""
from nvfp4stack.kernels.moe import (  # noqa: F401
    cutlass,
    deep_gemm,
    flashinfer_cutedsl,
    flashinfer_cutlass,
    flashinfer_trtllm,
    humming,
    marlin,
    torch_emulation,
    triton_w4a16,
    vllm_emulation,
)
