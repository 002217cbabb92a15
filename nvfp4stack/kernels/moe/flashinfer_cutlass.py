"""FlashInfer CUTLASS fused MoE (vLLM --moe-backend flashinfer_cutlass)."""
from nvfp4stack.kernels.base import FP4_TENSOR_CORE_ARCHS, MOE_BACKENDS
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("flashinfer_cutlass")
class FlashInferCutlassMoE(VllmMoeBackend):
    vllm_moe_backend = "flashinfer_cutlass"
    schemes = (Scheme.NVFP4, Scheme.FP8_BLOCK)
    archs = FP4_TENSOR_CORE_ARCHS
    activation_fp4 = True
    needs = "CUTLASS block-scaled FP4 MMA exists on sm_100a/sm_103a/sm_120a only"
