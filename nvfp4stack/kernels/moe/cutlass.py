"""vLLM's own CUTLASS NVFP4 grouped GEMM MoE (vLLM --moe-backend cutlass), SM100+."""
from nvfp4stack.kernels.base import MOE_BACKENDS, MXF4NVF4_ARCHS, VllmBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("cutlass")
class CutlassMoE(VllmBackend):
    kind = "moe"
    vllm_moe_backend = "cutlass"
    schemes = (Scheme.NVFP4, Scheme.FP8_BLOCK)
    archs = MXF4NVF4_ARCHS + ("sm120",)
    activation_fp4 = True
    needs = "vLLM's cutlass_moe_fp4 is compiled for SM100+ FP4 tensor cores"
