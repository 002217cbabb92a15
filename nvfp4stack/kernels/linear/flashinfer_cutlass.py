"""FlashInfer CUTLASS NVFP4 linear (vLLM linear backend flashinfer_cutlass)."""
from nvfp4stack.kernels.base import LINEAR_BACKENDS, MXF4NVF4_ARCHS, VllmBackend
from nvfp4stack.schemes import Scheme


@LINEAR_BACKENDS.register("flashinfer_cutlass")
class FlashInferCutlassLinear(VllmBackend):
    kind = "linear"
    vllm_linear_backend = "flashinfer_cutlass"
    schemes = (Scheme.NVFP4,)
    archs = MXF4NVF4_ARCHS + ("sm120",)
    activation_fp4 = True
    needs = "block-scaled FP4 MMA exists on sm_100a/sm_103a/sm_120a only"
