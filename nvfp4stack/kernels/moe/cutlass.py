"""vLLM's own CUTLASS NVFP4 grouped GEMM MoE (vLLM --moe-backend cutlass), SM100+."""
from nvfp4stack.kernels.base import FP4_TENSOR_CORE_ARCHS, MOE_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("cutlass")
class CutlassMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="cutlass", schemes=(Scheme.NVFP4, Scheme.FP8_BLOCK),
        archs=FP4_TENSOR_CORE_ARCHS, activation_fp4=True,
        arch_needs="vLLM's cutlass_moe_fp4 is compiled for SM100+ FP4 tensor cores")
