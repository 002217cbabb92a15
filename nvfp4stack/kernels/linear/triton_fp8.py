"""vLLM's Triton W8A8 block-FP8 linear (the portable FP8 block path, SM89+)."""
from nvfp4stack.kernels.base import LINEAR_BACKENDS, Capabilities
from nvfp4stack.kernels.vllm_backend import VllmLinearBackend
from nvfp4stack.schemes import Scheme


@LINEAR_BACKENDS.register("triton")
class TritonFp8Linear(VllmLinearBackend):
    capabilities = Capabilities(
        provider="vllm", vllm_flag="triton", schemes=(Scheme.FP8_BLOCK,), min_capability=(8, 9),
        arch_needs="FP8 E4M3 tensor cores")
