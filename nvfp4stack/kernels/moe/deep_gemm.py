"""DeepGEMM MoE (vLLM --moe-backend deep_gemm): FP8 block and MXFP4 (E2M1 + UE8M0 per 32)."""
from nvfp4stack.kernels.base import MOE_BACKENDS, Capabilities, Verdict
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("deep_gemm")
class DeepGemmMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="deep_gemm", schemes=(Scheme.MXFP4, Scheme.FP8_BLOCK),
        min_capability=(9, 0), arch_needs="DeepGEMM targets Hopper and Blackwell")

    @classmethod
    def can_implement(cls, scheme: Scheme) -> Verdict:
        if scheme.is_nvfp4:
            # The MegaMoE fork turned UE4M3/16 scales into UE8M0/32 and garbled the output.
            return False, (
                "deep_gemm's FP4 path is MXFP4 (UE8M0 per 32): NVFP4 experts would have to be "
                "re-scaled to UE8M0, losing 3 mantissa bits per scale; NVFP4 routed experts are "
                "never silently served as MXFP4 - pick an NVFP4 backend"
            )
        return super().can_implement(scheme)
