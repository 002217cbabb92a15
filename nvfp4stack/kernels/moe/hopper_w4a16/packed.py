"""The prepared form of the ``torch_emulation`` and ``triton_w4a16`` MoE backends."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
from nvfp4stack.kernels.base import MoeWeights
from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import Fp8ExpertWeights


@dataclass(frozen=True)
class PackedExperts:
    """The checkpoint's packed experts, plus the FP8 prefill copy of triton_w4a16 where it was asked
    for (``fp8``, +1 byte per weight). As they are (no copy, no shuffle), except where ``tiled``: then
    the packed bytes of w13/w2 are in tiles.py's tile-contiguous layout, which only the W4A16 kernels
    read (triton_w4a16 on sm90); scales and global scales stay as the checkpoint has them.
    ``routed_experts``: the experts the router chooses among where that is more than these (all
    ranks' under expert parallelism, where the ids arrive global), 0 otherwise; triton_w4a16 reads
    the rows per expert of a call (its tile choice) as tokens x top-k over that count."""

    weights: MoeWeights
    fp8: Fp8ExpertWeights | None = None
    tiled: bool = False
    routed_experts: int = 0

    def op_tensors(self) -> tuple[Optional[torch.Tensor], ...]:
        """The tensors an opaque custom op carries, in ``from_op_tensors``' order (NVFP4 experts)."""
        w, f = self.weights, self.fp8
        if not isinstance(w.w13, Nvfp4Tensor) or not isinstance(w.w2, Nvfp4Tensor):
            raise TypeError(f"PackedExperts.op_tensors: expected NVFP4 w13/w2, found "
                            f"{type(w.w13).__name__}/{type(w.w2).__name__}")
        fp8 = (f.w13, f.w13_scale, f.w2, f.w2_scale) if f is not None else (None,) * 4
        return (w.w13.data, w.w13.scale, w.w13.global_scale, w.w2.data, w.w2.scale, w.w2.global_scale,
                w.a13_scale, w.a2_scale, *fp8)

    @classmethod
    def from_op_tensors(cls, w13_data: torch.Tensor, w13_scale: torch.Tensor, w13_gs: torch.Tensor,
                        w2_data: torch.Tensor, w2_scale: torch.Tensor, w2_gs: torch.Tensor,
                        a13_scale: Optional[torch.Tensor], a2_scale: Optional[torch.Tensor],
                        fp8_w13: Optional[torch.Tensor], fp8_w13_scale: Optional[torch.Tensor],
                        fp8_w2: Optional[torch.Tensor], fp8_w2_scale: Optional[torch.Tensor],
                        tiled: bool = False, routed_experts: int = 0) -> PackedExperts:
        """Inverse of ``op_tensors``: views on the same storage."""
        e, two_i, h_half = w13_data.shape  # packed: 2 E2M1 codes per byte
        w13 = Nvfp4Tensor(w13_data, w13_scale, w13_gs, (e, two_i, h_half * 2))
        w2 = Nvfp4Tensor(w2_data, w2_scale, w2_gs, (e, h_half * 2, two_i // 2))
        fp8 = Fp8ExpertWeights(fp8_w13, fp8_w13_scale, fp8_w2, fp8_w2_scale) if fp8_w13 is not None else None
        return cls(MoeWeights(w13, w2, a13_scale, a2_scale), fp8, tiled, routed_experts)
