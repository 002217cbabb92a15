"""vLLM Marlin linear: weight-only FP4/FP8, dequantized to bf16 inside the kernel (SM80+)."""
from nvfp4stack.kernels.base import LINEAR_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmLinearBackend
from nvfp4stack.schemes import Scheme


@LINEAR_BACKENDS.register("marlin")
class MarlinLinear(VllmLinearBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="marlin",
        schemes=(Scheme.NVFP4, Scheme.NVFP4_W4A16, Scheme.MXFP4, Scheme.FP8_BLOCK), min_capability=(8, 0),
        arch_needs="Marlin's mma.sync bf16 path")
