"""vLLM Marlin MoE (vLLM --moe-backend marlin): weight-only FP4, dequantized to bf16 in the kernel."""
from nvfp4stack.kernels.base import MOE_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("marlin")
class MarlinMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="marlin", schemes=(Scheme.NVFP4, Scheme.NVFP4_W4A16, Scheme.MXFP4),
        min_capability=(8, 0), arch_needs="Marlin's mma.sync bf16 path")
