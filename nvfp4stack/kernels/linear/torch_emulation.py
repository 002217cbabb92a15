"""Pure-torch linear for any stored format: dequantize the typed weight, then one GEMM.

The fidelity harness and CPU planning use it (e.g. DeepSeek-V4's FP8-block attention on a host
without FP8 kernels). It is not wired into vLLM serving: the plugin refuses it for served
linear layers and vLLM keeps its own method there.
"""
from __future__ import annotations

import torch

from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import LINEAR_BACKENDS, KernelBackend, Verdict
from nvfp4stack.schemes import Scheme


def emulated_linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with ``weight`` a typed container (Nvfp4Tensor, Fp8BlockTensor, ...);
    x: [..., K], weight: [N, K] -> [..., N] in x.dtype, accumulated in fp32."""
    w = weight.dequantize(torch.float32)
    y = x.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@LINEAR_BACKENDS.register("torch_emulation")
class TorchEmulationLinear(KernelBackend):
    kind = "linear"
    provider = "nvfp4stack"
    schemes = (Scheme.NVFP4_W4A16, Scheme.MXFP4, Scheme.FP8_BLOCK)
    emulated = True

    forward = staticmethod(emulated_linear)

    @classmethod
    def is_supported(cls, arch: Arch) -> Verdict:
        return True, "pure torch dequantize + GEMM, any device (fidelity and CPU planning; not used for serving)"
