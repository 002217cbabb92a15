"""vLLM Humming MoE (vLLM --moe-backend humming): weight-only FP4 for SM75+."""
from nvfp4stack.kernels.base import MOE_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("humming")
class HummingMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="humming", schemes=(Scheme.NVFP4, Scheme.NVFP4_W4A16),
        min_capability=(7, 5), arch_needs="Humming's weight-only kernels")
