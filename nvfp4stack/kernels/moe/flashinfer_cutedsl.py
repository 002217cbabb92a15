"""FlashInfer CuTeDSL grouped GEMM MoE (vLLM --moe-backend flashinfer_cutedsl), needs nvidia-cutlass-dsl."""
from nvfp4stack.kernels.base import MOE_BACKENDS, MXF4NVF4_ARCHS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmMoeBackend
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("flashinfer_cutedsl")
class FlashInferCuteDslMoE(VllmMoeBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="flashinfer_cutedsl", schemes=(Scheme.NVFP4,), archs=MXF4NVF4_ARCHS,
        activation_fp4=True,
        arch_needs="CuTeDSL ScaledGroupedGemm uses tcgen05 block-scaled MMA, built for sm_100a/sm_103a")


MOE_BACKENDS.alias("cutedsl", "flashinfer_cutedsl")
