"""FlashInfer CUTLASS fused MoE (vLLM --moe-backend flashinfer_cutlass)."""
from nvfp4stack.kernels.base import FP4_TENSOR_CORE_ARCHS, MOE_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("flashinfer_cutlass")
class FlashInferCutlassMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="flashinfer_cutlass", schemes=(Scheme.NVFP4, Scheme.FP8_BLOCK),
        archs=FP4_TENSOR_CORE_ARCHS, activation_fp4=True,
        arch_needs="CUTLASS block-scaled FP4 MMA exists on sm_100a/sm_103a/sm_120a only")
