"""The NVFP4 (or MXFP4) expert MLP in plain torch (any device): the twin of the fused kernels.

It runs the ``torch_emulation`` backend (the CPU serving path of the vLLM plugin) and is the
oracle of every fast MoE kernel here. Weights stay packed; each expert that received tokens is
dequantized on the fly in fp32, and all arithmetic is fp32 (the output is cast back to x.dtype
once). MXFP4 experts (E2M1 + UE8M0 per 32, as released checkpoints and their unquantized MTP
blocks store them) run weight-only.
"""
from __future__ import annotations

import torch

from nvfp4stack.formats.mxfp4 import Mxfp4Tensor, dequantize_mxfp4
from nvfp4stack.formats.nvfp4 import (
    Nvfp4Tensor,
    dequantize_nvfp4,
    fake_quantize_nvfp4_activation,
)


def clamped_swiglu(gate_up: torch.Tensor, swiglu_limit: float | None) -> torch.Tensor:
    """[.., 2I] -> [.., I]: clamped SwiGLU (``swiglu_limit``), plain SwiGLU when it is None.

    gate.clamp(max=limit), up.clamp(-limit, limit), silu(gate) * up: the expert activation of
    models whose config has ``swiglu_limit`` (transformers' ``_apply_gate`` of those experts).
    """
    gate, up = gate_up.chunk(2, dim=-1)
    if swiglu_limit is not None:
        gate = gate.clamp(max=swiglu_limit)
        up = up.clamp(min=-swiglu_limit, max=swiglu_limit)
    return torch.nn.functional.silu(gate) * up


def dequantize_expert(w: Nvfp4Tensor | Mxfp4Tensor, expert: int) -> torch.Tensor:
    """Expert ``expert`` of a stacked [E, N, K] NVFP4 or MXFP4 weight as fp32 [N, K]."""
    if isinstance(w, Mxfp4Tensor):
        return dequantize_mxfp4(w.data[expert], w.scale[expert], torch.float32)
    gs = w.global_scale.reshape(-1)
    gs_e = gs[expert] if gs.numel() > 1 else gs[0]
    return dequantize_nvfp4(w.data[expert], w.scale[expert], gs_e, torch.float32)


def _scale_of(scales: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    if scales is None:
        return None
    s = scales.reshape(-1)
    return (s[expert] if s.numel() > 1 else s[0]).to(torch.float32)


def check_moe_args(x, w13, w2, topk_weights, topk_ids, activation) -> tuple[int, int, int]:
    """Shape checks shared by every NVFP4 MoE backend here (no host sync); returns (E, I, H)."""
    if activation != "silu":
        raise ValueError(f"activation: only 'silu' (SwiGLU) is implemented, found {activation!r}")
    if len(w13.shape) != 3 or w13.shape[1] % 2:
        raise ValueError(
            f"w13: expected [E, 2I, H] (rows 0..I-1 gate w1, I..2I-1 up w3), found {tuple(w13.shape)}"
        )
    e, two_i, h = w13.shape
    if tuple(w2.shape) != (e, h, two_i // 2):
        raise ValueError(
            f"w2: expected [E, H, I] = {(e, h, two_i // 2)} to match w13 {tuple(w13.shape)}, "
            f"found {tuple(w2.shape)}"
        )
    if x.dim() != 2 or x.shape[1] != h:
        raise ValueError(f"x: expected [T, {h}] (w13's hidden size), found {tuple(x.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"topk_ids/topk_weights: expected both [T={x.shape[0]}, k], found "
            f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}"
        )
    return e, two_i // 2, h


def _check_expert_ids(topk_ids: torch.Tensor, e: int) -> None:
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= e):
        raise ValueError(
            f"topk_ids: expected expert ids in [0, {e}), found range "
            f"[{int(topk_ids.min())}, {int(topk_ids.max())}]; map global ids to local experts first"
        )


def nvfp4_moe_forward(
    x: torch.Tensor,
    w13: Nvfp4Tensor,
    w2: Nvfp4Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
    a13_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    activation: str = "silu",
) -> torch.Tensor:
    """Routed-expert MLP: sum_j topk_weights[t, j] * w2_e(swiglu(w13_e x_t)), e = topk_ids[t, j].

    Args:
        x: [T, H] activations.
        w13: NVFP4 or MXFP4 [E, 2I, H]; rows 0..I-1 gate (w1), I..2I-1 up (w3).
        w2: same format, [E, H, I].
        topk_weights, topk_ids: [T, k] router output (ids are local expert indices).
        a13_scale, a2_scale: [E] static input scales; when given, activations are NVFP4
            fake-quantized before each GEMM (W4A4), else they stay unquantized (W4A16).
    Returns:
        [T, H] in x.dtype.
    """
    num_experts, _, _ = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation)
    _check_expert_ids(topk_ids, num_experts)
    if (a13_scale is not None or a2_scale is not None) and isinstance(w13, Mxfp4Tensor):
        raise ValueError("a13_scale/a2_scale: MXFP4 experts run weight-only here (bf16/fp32 "
                         "activations), found activation input scales; pass None")
    tokens, top_k = topk_ids.shape
    out = torch.zeros(tokens, x.shape[1], dtype=torch.float32, device=x.device)
    xf = x.to(torch.float32)
    flat_ids = topk_ids.reshape(-1)
    flat_w = topk_weights.reshape(-1).to(torch.float32)
    for expert in torch.unique(flat_ids).tolist():  # only experts that received tokens
        slots = (flat_ids == expert).nonzero().squeeze(1)
        tok = slots // top_k
        xe = xf[tok]  # [n, H]
        a13 = _scale_of(a13_scale, expert)
        if a13 is not None:
            xe = fake_quantize_nvfp4_activation(xe, a13, dtype=torch.float32)
        hmid = clamped_swiglu(xe @ dequantize_expert(w13, expert).T, swiglu_limit)  # [n, I]
        a2 = _scale_of(a2_scale, expert)
        if a2 is not None:
            hmid = fake_quantize_nvfp4_activation(hmid, a2, dtype=torch.float32)
        ye = hmid @ dequantize_expert(w2, expert).T  # [n, H]
        out.index_add_(0, tok, ye * flat_w[slots, None])
    return out.to(x.dtype)
