"""FlashInfer TensorRT-LLM fused MoE (vLLM --moe-backend flashinfer_trtllm): Blackwell FP4 tensor cores."""
from nvfp4stack.kernels.base import MOE_BACKENDS, MXF4NVF4_ARCHS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("flashinfer_trtllm")
class FlashInferTrtllmMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="flashinfer_trtllm", schemes=(Scheme.NVFP4, Scheme.MXFP4, Scheme.FP8_BLOCK),
        archs=MXF4NVF4_ARCHS, activation_fp4=True,
        arch_needs="tcgen05.mma kind::mxf4nvf4 exists only on arch-specific sm_100a/sm_103a, not sm_100f")
