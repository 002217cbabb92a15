"""FlashInfer CUTLASS NVFP4 linear (vLLM linear backend flashinfer_cutlass)."""
from nvfp4stack.kernels.base import FP4_TENSOR_CORE_ARCHS, LINEAR_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmLinearBackend
from nvfp4stack.schemes import Scheme


@LINEAR_BACKENDS.register("flashinfer_cutlass")
class FlashInferCutlassLinear(VllmLinearBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="flashinfer_cutlass", schemes=(Scheme.NVFP4,), archs=FP4_TENSOR_CORE_ARCHS,
        activation_fp4=True, arch_needs="block-scaled FP4 MMA exists on sm_100a/sm_103a/sm_120a only")
