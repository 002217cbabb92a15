"""vLLM CUTLASS scaled-mm linear: FP8 block on SM90+, NVFP4 W4A4 on SM100a/103a/120."""
from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import FP4_TENSOR_CORE_ARCHS, LINEAR_BACKENDS, Capabilities, Verdict
from nvfp4stack.kernels.vllm_backend import VllmLinearBackend
from nvfp4stack.schemes import Scheme


@LINEAR_BACKENDS.register("cutlass")
class CutlassLinear(VllmLinearBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="cutlass", schemes=(Scheme.FP8_BLOCK, Scheme.NVFP4), min_capability=(9, 0),
        activation_fp4=True,
        arch_needs="CUTLASS 3.x block-scaled GEMMs (FP8 from sm_90, FP4 only on sm_100a/sm_103a/sm_120a)")

    @classmethod
    def supports_scheme_on(cls, scheme: Scheme, arch: Arch) -> Verdict:
        if scheme is Scheme.NVFP4 and arch.name not in FP4_TENSOR_CORE_ARCHS:
            return False, f"cutlass NVFP4 GEMM needs sm100a/sm103a/sm120 FP4 tensor cores; arch is {arch}"
        return True, "ok"
