"""Linear backends, one per file; importing this package registers them all."""
from nvfp4stack.kernels.linear import (  # noqa: F401
    cutlass,
    deep_gemm,
    flashinfer_cutlass,
    marlin,
    torch_emulation,
    triton_fp8,
    vllm_emulation,
)
