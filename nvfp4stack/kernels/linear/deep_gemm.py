"""DeepGEMM FP8 block-scaled linear (vLLM picks it for 128x128 FP8 weights on Hopper/Blackwell)."""
from nvfp4stack.kernels.base import LINEAR_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmLinearBackend
from nvfp4stack.schemes import Scheme


@LINEAR_BACKENDS.register("deep_gemm")
class DeepGemmLinear(VllmLinearBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="deep_gemm", schemes=(Scheme.FP8_BLOCK,), min_capability=(9, 0),
        arch_needs="DeepGEMM's FP8 wgmma/tcgen05 GEMMs")
