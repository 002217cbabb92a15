"""``triton_w4a16`` MoE backend: fused NVFP4 weight-only expert MLP in Triton (Hopper and later).

Two launches over expert-aligned token blocks (routing.py):
  L1  x[T,H] @ w13[e]^T -> DeepSeek-V4 clamped SwiGLU -> h[slots, I]   (bf16, sorted-slot order)
  L2  h @ w2[e]^T * routing weight -> rows[T*k, H]; top-k rows summed per token.
Weights stay packed; tiles are dequantized in registers. Triton is imported only when the
kernel runs, so CPU hosts can import this module to register the backend.
Prefill-heavy calls can instead run the FP8 tensor-core mode (fp8_prefill.py, ``mode``/``fp8_weights``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import MOE_BACKENDS, KernelBackend, Verdict
from nvfp4stack.kernels.moe.routing import align_by_expert
from nvfp4stack.kernels.moe.torch_emulation import check_moe_args
from nvfp4stack.schemes import Scheme

if TYPE_CHECKING:
    from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
    from nvfp4stack.kernels.moe.fp8_prefill import Fp8ExpertWeights

_SUPPORTED_SM = (80, 89, 90, 100, 103, 120)


@dataclass(frozen=True)
class TileConfig:
    """One launch's tile shape; ``block_k`` is capped to divide the reduction dim."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    deq: int = 2  # 2: PTX bit placement, 1: per-element Triton ops (_dequant_tile)

    def fit_k(self, k: int) -> int:
        # K tiles below 64 are not used: on an H200 with Triton 3.6 a 16-wide tile gave wrong
        # results and 32-wide ones crashed the compiler (TritonGPUOptimizeDotOperands).
        bk = self.block_k
        while bk > 64 and k % bk:
            bk //= 2
        if k % bk:
            raise ValueError(
                f"triton_w4a16: reduction dim {k} (hidden or moe_intermediate) must be a multiple "
                "of 64; use the torch_emulation backend for this shape"
            )
        return bk

    def launch_args(self, k: int) -> dict:
        return dict(
            BM=self.block_m, BN=self.block_n, BK=self.fit_k(k), GROUP_M=self.group_m,
            DEQ=self.deq,
            num_warps=self.num_warps, num_stages=self.num_stages,
        )


# Tile heuristics by average routed rows per expert. Decode is bound by weight bytes and by the
# ALU work of dequantizing them: smallest legal M tile. Prefill is MMA bound: large M tiles so
# each dequantized weight tile feeds more rows. Figures behind the choice: bench/moe_kernel_notes.md.
_DECODE = TileConfig(block_m=16, block_n=64, block_k=256, num_warps=4, num_stages=3)
_SMALL = TileConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=4)
_MEDIUM = TileConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4)
_PREFILL = TileConfig(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=3)


def pick_config(rows_per_expert: float) -> tuple[TileConfig, TileConfig]:
    """Heuristic (L1, L2) tile choice from the average routed rows per expert."""
    if rows_per_expert <= 16:
        return _DECODE, _DECODE
    if rows_per_expert <= 48:
        return _SMALL, _SMALL
    if rows_per_expert <= 160:
        return _MEDIUM, _MEDIUM
    return _PREFILL, _PREFILL


def _t(*a, **kw) -> tuple[TileConfig, TileConfig]:
    c = TileConfig(*a, **kw)
    return c, c


# (L1, L2) pairs the benchmark's --sweep tries besides the heuristic's pick.
CANDIDATES: tuple[tuple[TileConfig, TileConfig], ...] = (
    _t(16, 64, 256, 4, 3, deq=1),  # per-element dequant, for comparison
    _t(16, 64, 128, 4, 5),
    _t(16, 32, 256, 4, 4),
    (TileConfig(16, 32, 256, 4, 4), TileConfig(16, 64, 256, 4, 4)),
    _t(32, 64, 256, 4, 4),
    _t(64, 64, 128, 4, 4),
    _t(64, 128, 128, 4, 4),
    _t(128, 64, 64, 4, 4),
    _t(128, 128, 64, 8, 4),
    (TileConfig(256, 64, 64, 8, 4), TileConfig(256, 128, 64, 8, 4)),
)
# Diagnostics for --sweep --diag (WRONG numbers, never selected): same loads and MMAs, no dequant.
DIAG = (_t(16, 64, 256, 4, 3, deq=9), _t(128, 64, 64, 4, 3, deq=9))


def _global_scale_per_expert(t: "Nvfp4Tensor", num_experts: int, name: str) -> torch.Tensor:
    gs = t.global_scale.to(torch.float32).reshape(-1)
    if gs.numel() == 1:
        gs = gs.expand(num_experts)
    if gs.numel() != num_experts:
        raise ValueError(
            f"{name}.global_scale: expected 1 or {num_experts} values (one per expert), "
            f"found {gs.numel()}; quantize the stacked [E, N, K] weight with quantize_nvfp4"
        )
    return gs.contiguous()


def nvfp4_moe_forward_triton(
    x: torch.Tensor,
    w13: "Nvfp4Tensor",
    w2: "Nvfp4Tensor",
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
    a13_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    activation: str = "silu",
    config: tuple[TileConfig, TileConfig] | None = None,
    poison: bool = False,
    mode: str = "auto",
    fp8_weights: "Fp8ExpertWeights | None" = None,
) -> torch.Tensor:
    """Same function as torch_emulation.nvfp4_moe_forward with bf16 activations.

    a13_scale / a2_scale are accepted and ignored: this path is weight-only, activations stay bf16.
    ``config`` overrides the (L1, L2) tile heuristic (benchmark sweeps). ``poison`` fills the
    scratch buffers with NaN first, so a test sees any element the kernels failed to write.
    ``mode``: 'w4a16', 'fp8' (FP8 tensor-core prefill on ``fp8_weights``, built once at load by
    fp8_prefill.prepare_fp8_experts) or 'auto' (fp8 from FP8_MIN_ROWS_PER_EXPERT routed rows per
    expert when ``fp8_weights`` is given, else w4a16).
    """
    from nvfp4stack.kernels.moe import fp8_prefill

    num_experts, inter, hidden = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation)
    if x.device.type != "cuda":
        raise ValueError(
            f"triton_w4a16: x is on {x.device}, expected a CUDA tensor; "
            "use backend.moe=torch_emulation on CPU"
        )
    tokens, top_k = topk_ids.shape
    out_dtype = x.dtype
    xb = x.to(torch.bfloat16).contiguous()
    if tokens == 0:
        return torch.zeros_like(x)
    if fp8_prefill.select_mode(mode, tokens * top_k / num_experts, fp8_weights) == "fp8":
        fp8_prefill.check_fp8_matches(fp8_weights, w13, w2)
        return fp8_prefill.fp8_moe_forward(
            xb, fp8_weights, topk_weights, topk_ids, swiglu_limit=swiglu_limit, poison=poison
        ).to(out_dtype)

    from nvfp4stack.kernels.moe._triton_w4a16_kernels import l1_swiglu_kernel, l2_combine_kernel

    cfg1, cfg2 = config or pick_config(tokens * top_k / num_experts)
    if cfg1.block_m != cfg2.block_m:
        raise ValueError(f"config: L1 and L2 share the routing blocks, found block_m {cfg1.block_m} != {cfg2.block_m}")
    routing = align_by_expert(topk_ids, num_experts, cfg1.block_m)
    w13_data, w13_scale = w13.data.contiguous(), w13.scale.contiguous().view(torch.uint8)
    w2_data, w2_scale = w2.data.contiguous(), w2.scale.contiguous().view(torch.uint8)
    gs13 = _global_scale_per_expert(w13, num_experts, "w13")
    gs2 = _global_scale_per_expert(w2, num_experts, "w2")

    scratch = torch.full if poison else (lambda size, _fill, **kw: torch.empty(size, **kw))
    inter_buf = scratch((routing.sorted_ids.numel(), inter), float("nan"), dtype=torch.bfloat16, device=x.device)
    grid1 = (routing.max_blocks * triton_cdiv(inter, cfg1.block_n),)
    l1_swiglu_kernel[grid1](
        xb, xb.stride(0),
        w13_data, w13_data.stride(0), w13_data.stride(1),
        w13_scale, w13_scale.stride(0), w13_scale.stride(1),
        gs13,
        inter_buf, inter_buf.stride(0),
        routing.sorted_ids, routing.expert_ids, routing.num_padded,
        routing.num_slots, top_k, inter, hidden, routing.max_blocks,
        float(swiglu_limit) if swiglu_limit is not None else 0.0,
        HAS_LIMIT=swiglu_limit is not None,
        **cfg1.launch_args(hidden),
    )

    rows = scratch((tokens * top_k, hidden), float("nan"), dtype=torch.bfloat16, device=x.device)
    route_w = topk_weights.to(torch.float32).reshape(-1).contiguous()
    grid2 = (routing.max_blocks * triton_cdiv(hidden, cfg2.block_n),)
    l2_combine_kernel[grid2](
        inter_buf, inter_buf.stride(0),
        w2_data, w2_data.stride(0), w2_data.stride(1),
        w2_scale, w2_scale.stride(0), w2_scale.stride(1),
        gs2, route_w,
        rows, rows.stride(0),
        routing.sorted_ids, routing.expert_ids, routing.num_padded,
        routing.num_slots, hidden, inter, routing.max_blocks,
        **cfg2.launch_args(inter),
    )
    # top-k combine in fp32, like vLLM's moe_sum
    return rows.view(tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(out_dtype)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@MOE_BACKENDS.register("triton_w4a16")
class TritonW4A16Moe(KernelBackend):
    """NVFP4 weights dequantized in registers, bf16 activations, fused DSV4 SwiGLU (Triton)."""

    kind = "moe"
    provider = "nvfp4stack"
    schemes = (Scheme.NVFP4, Scheme.NVFP4_W4A16)

    forward = staticmethod(nvfp4_moe_forward_triton)

    @classmethod
    def is_supported(cls, arch: Arch) -> Verdict:
        if not arch.is_cuda:
            return False, (
                "triton_w4a16 needs a CUDA GPU (sm80, sm89, sm90, sm100, sm120) with Triton; "
                f"arch {arch} has none: use torch_emulation on CPU"
            )
        if arch.sm not in _SUPPORTED_SM:
            return False, f"triton_w4a16 is built and tested for sm{_SUPPORTED_SM}, not {arch}"
        return True, (
            "NVFP4 weights dequantized in registers, bf16 activations; NVFP4 (W4A4) checkpoints "
            "are served weight-only here (activation input_scale unused)"
        )
