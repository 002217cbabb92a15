"""Bytes per tensor group under a scheme, and how a TP/EP/DP layout shards them across GPUs."""
from __future__ import annotations

import math
from dataclasses import dataclass

from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.schemes import Scheme

_DTYPE_BYTES = {"bf16": 2, "f32": 4, "i64": 8, "i32": 4}


@dataclass
class Layout:
    """How the engine spreads the model: tensor parallel x data parallel, experts optionally EP."""

    tp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp


def group_bytes(group: TensorGroup, scheme: Scheme, fp8_ue8m0: bool = True) -> int:
    """Stored bytes of one group in ``scheme``, scales included."""
    if not group.is_matrix or scheme is Scheme.PASSTHROUGH:
        return group.numel * _DTYPE_BYTES.get(group.dtype, 2)
    n = group.numel
    *lead, rows, cols = group.shape
    batches = math.prod(lead) if lead else 1
    if scheme.is_nvfp4:
        return n // 2 + n // 16 + 2 * 4 * batches  # E2M1 + UE4M3/16 + weight_scale_2 + input_scale
    if scheme is Scheme.MXFP4:
        return n // 2 + n // 32
    if scheme is Scheme.FP8_BLOCK:
        blocks = batches * math.ceil(rows / 128) * math.ceil(cols / 128)
        return n + blocks * (1 if fp8_ue8m0 else 4)
    return n * 2  # bf16


def shard_factor(group: TensorGroup, layout: Layout, tp_sharded: tuple[str, ...]) -> int:
    """How many GPUs share one copy of this group; ``tp_sharded``: the roles the model family's vLLM
    model splits across tensor-parallel ranks (``ModelFamily.tp_sharded_roles``)."""
    if group.role == "routed_experts":
        return layout.tp * layout.dp if layout.ep else layout.tp
    if group.role in tp_sharded:
        return layout.tp
    return 1
