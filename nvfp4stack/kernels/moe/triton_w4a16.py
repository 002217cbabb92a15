"""``triton_w4a16`` MoE backend: NVFP4 weights dequantized in registers, bf16 activations (hopper_w4a16/).

Importing this module registers the backend and imports no Triton: the kernels load when
``apply`` first runs, so CPU hosts plan with it.
"""
from __future__ import annotations

import dataclasses

import torch

from nvfp4stack.arch import Arch
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
from nvfp4stack.kernels.base import MOE_BACKENDS, Capabilities, MoeWeights, RunnableMoeBackend, Verdict
from nvfp4stack.kernels.moe.hopper_w4a16.packed import PackedExperts
from nvfp4stack.schemes import Scheme

_SUPPORTED_SM = (80, 89, 90, 100, 103, 120)


@MOE_BACKENDS.register("triton_w4a16")
class TritonW4A16Moe(RunnableMoeBackend):
    """Fused NVFP4 weight-only expert MLP with clamped SwiGLU (Triton; Gluon decode on sm90)."""

    capabilities = Capabilities(
        provider="nvfp4stack", schemes=(Scheme.NVFP4, Scheme.NVFP4_W4A16),
        negative_expert_ids=True,  # routing drops them, the top-k combine skips their rows
        fp8_prefill=True)
    prepared_type = PackedExperts

    @classmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
        if not arch.is_cuda:
            return False, (
                f"triton_w4a16 needs a CUDA GPU ({', '.join(f'sm{v}' for v in _SUPPORTED_SM)}) with Triton; "
                f"arch {arch} has none: use torch_emulation on CPU"
            )
        if arch.sm not in _SUPPORTED_SM:
            return False, f"triton_w4a16 is built and tested for sm{_SUPPORTED_SM}, not {arch}"
        return True, (
            "NVFP4 weights dequantized in registers, bf16 activations; NVFP4 (W4A4) checkpoints "
            "are served weight-only here (activation input_scale unused)"
        )

    @classmethod
    def prepare(cls, weights: MoeWeights, *, fp8_prefill: bool = False, routed_experts: int = 0) -> PackedExperts:
        """The packed NVFP4 experts; with ``fp8_prefill`` also their FP8 row-scaled copy (+1 byte per
        weight, built once), which ``apply`` uses from 64 routed rows per expert. On sm90 (where the
        Gluon decode kernels run) and shapes that tile, the packed bytes are copied once into the tile
        layout of hopper_w4a16/tiles.py (1-14% less decode time at 8-16 rows per expert, H200); the
        inputs are left as they are."""
        for name in ("w13", "w2"):
            w = getattr(weights, name)
            if not isinstance(w, Nvfp4Tensor):
                raise ValueError(f"triton_w4a16: {name} is {type(w).__name__}, expected Nvfp4Tensor; "
                                 "MXFP4 experts run on torch_emulation or a vLLM backend (marlin)")
        fp8 = None
        if fp8_prefill:
            from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import prepare_fp8_experts

            fp8 = prepare_fp8_experts(weights.w13, weights.w2)  # from the row-major bytes
        from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
        from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import decode_available

        tiled = decode_available(weights.w13.data.device) and tiles.experts_fit(weights.w13, weights.w2)
        if tiled:
            w13, w2 = tiles.tile_experts(weights.w13, weights.w2)
            weights = dataclasses.replace(weights, w13=w13, w2=w2)
        return PackedExperts(weights, fp8, tiled, routed_experts)

    @classmethod
    def apply(cls, prepared: PackedExperts, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, *, swiglu_limit: float | None = None,
              activation: str = "silu") -> torch.Tensor:
        """'auto' mode: FP8 prefill where ``prepared`` has the copy and the load is large, else W4A16."""
        from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton

        w = prepared.weights
        return nvfp4_moe_forward_triton(x, w.w13, w.w2, topk_weights, topk_ids, swiglu_limit=swiglu_limit,
                                        activation=activation, mode="auto", fp8_weights=prepared.fp8,
                                        tiled=prepared.tiled, routed_experts=prepared.routed_experts)

    @classmethod
    def warm_up(cls, prepared: PackedExperts, *, top_k: int, max_tokens: int,
                swiglu_limit: float | None) -> list[int]:
        from nvfp4stack.kernels.moe.hopper_w4a16.warmup import warm_up

        w = prepared.weights
        return warm_up(w.w13, w.w2, top_k, max_tokens, swiglu_limit=swiglu_limit, fp8_weights=prepared.fp8,
                       tiled=prepared.tiled, routed_experts=prepared.routed_experts)
