"""``torch_emulation`` MoE backend: the expert MLP in fp32 torch (hopper_w4a16/torch_twin.py), any device.

The CPU serving path of the vLLM plugin: NVFP4 W4A4 (activations fake-quantized with the
checkpoint's input scales) or W4A16, and MXFP4 weight-only. Correct everywhere, slow.
"""
from __future__ import annotations

import torch

from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import MOE_BACKENDS, Capabilities, MoeWeights, RunnableMoeBackend, Verdict, backends_with
from nvfp4stack.kernels.moe.hopper_w4a16.packed import PackedExperts
from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward
from nvfp4stack.schemes import Scheme


@MOE_BACKENDS.register("torch_emulation")
class TorchEmulationMoe(RunnableMoeBackend):
    """Pure-torch NVFP4 MoE (W4A4 or W4A16 emulation), MXFP4 weight-only."""

    # W4A4 is emulated (activations fake-quantized with the checkpoint's input scales), so it
    # needs no FP4 tensor cores.
    capabilities = Capabilities(provider="nvfp4stack", schemes=(Scheme.NVFP4, Scheme.NVFP4_W4A16, Scheme.MXFP4),
                                activation_fp4=True, emulated=True)
    prepared_type = PackedExperts

    @classmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
        return True, "pure torch, any device; slow: for CPU serving, tests and fidelity"

    @classmethod
    def prepare(cls, weights: MoeWeights, *, fp8_prefill: bool = False, routed_experts: int = 0) -> PackedExperts:
        """The packed experts as they are: each expert is dequantized when it receives tokens."""
        if fp8_prefill:
            able = " or ".join(f"backend.moe={n}" for n in backends_with("moe", lambda c: c.fp8_prefill))
            raise ValueError(f"torch_emulation has no FP8 prefill mode: backend.moe_fp8_prefill=true "
                             f"needs {able}; set backend.moe_fp8_prefill=false")
        return PackedExperts(weights, routed_experts=routed_experts)

    @classmethod
    def apply(cls, prepared: PackedExperts, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, swiglu_limit: float | None = None,
              activation: str = "silu") -> torch.Tensor:
        w = prepared.weights
        return nvfp4_moe_forward(x, w.w13, w.w2, topk_weights, topk_ids, swiglu_limit=swiglu_limit,
                                 a13_scale=w.a13_scale, a2_scale=w.a2_scale, activation=activation)
