"""FlashInfer CUTLASS fused MoE (vLLM --moe-backend flashinfer_cutlass)."""
from nvfp4stack.kernels.base import MOE_BACKENDS, MXF4NVF4_ARCHS, VllmBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("flashinfer_cutlass")
class FlashInferCutlassMoE(VllmBackend):
    kind = "moe"
    vllm_moe_backend = "flashinfer_cutlass"
    schemes = (Scheme.NVFP4, Scheme.FP8_BLOCK)
    archs = MXF4NVF4_ARCHS + ("sm120",)
    activation_fp4 = True
    needs = "CUTLASS block-scaled FP4 MMA exists on sm_100a/sm_103a/sm_120a only"
