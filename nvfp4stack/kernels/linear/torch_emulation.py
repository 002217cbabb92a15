"""Pure-torch linear for any stored format: dequantize the typed weight, then one GEMM.

The fidelity harness uses it, and vLLM serves with it where the plan puts a linear on it (e.g.
the FP8-block attention and shared-expert projections on a CPU host): the plugin's linear method
(engine/linear_method.py) loads the layer with vLLM's own parameters and calls ``prepare``/``apply``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import LINEAR_BACKENDS, Capabilities, RunnableLinearBackend, Verdict
from nvfp4stack.schemes import Scheme


def emulated_linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with ``weight`` a typed container (Nvfp4Tensor, Fp8BlockTensor, ...);
    x: [..., K], weight: [N, K] -> [..., N] in x.dtype, accumulated in fp32."""
    w = weight.dequantize(torch.float32)
    y = x.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@dataclass(frozen=True)
class TypedLinear:
    """The typed weight [N, K] as stored (dequantized at each call) and its bias [N]."""

    weight: Any
    bias: torch.Tensor | None = None


@LINEAR_BACKENDS.register("torch_emulation")
class TorchEmulationLinear(RunnableLinearBackend):
    capabilities = Capabilities(provider="nvfp4stack", schemes=(Scheme.NVFP4_W4A16, Scheme.MXFP4, Scheme.FP8_BLOCK),
                                emulated=True)

    @classmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
        # the reason is printed in plan.json (goldens): its wording stays although vLLM now serves it
        return True, "pure torch dequantize + GEMM, any device (fidelity and CPU planning; not used for serving)"

    @classmethod
    def prepare(cls, weight: Any, bias: torch.Tensor | None = None) -> TypedLinear:
        if isinstance(weight, torch.Tensor) or not hasattr(weight, "dequantize"):
            raise TypeError(f"torch_emulation linear: weight is {type(weight).__name__}, expected a typed "
                            "container with .dequantize() (Nvfp4Tensor, Mxfp4Tensor, Fp8BlockTensor)")
        return TypedLinear(weight, bias)

    @classmethod
    def apply(cls, prepared: TypedLinear, x: torch.Tensor) -> torch.Tensor:
        return emulated_linear(x, prepared.weight, prepared.bias)
