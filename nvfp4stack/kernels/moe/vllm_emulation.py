"""vLLM's emulation MoE (vLLM --moe-backend emulation): dequantize + bf16 GEMM, any CUDA GPU."""
from nvfp4stack.kernels.base import MOE_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("vllm_emulation")
class VllmEmulationMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="emulation",
        schemes=(Scheme.NVFP4, Scheme.NVFP4_W4A16, Scheme.MXFP4, Scheme.FP8_BLOCK), min_capability=(7, 0),
        activation_fp4=True,
        emulated=True,  # it emulates W4A4 faithfully (fake-quantizes activations)
        arch_needs="vLLM's Triton emulation kernels run on CUDA only")
