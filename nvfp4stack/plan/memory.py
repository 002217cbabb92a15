"""Bytes per tensor group under a scheme, and how a TP/EP/DP layout shards them across GPUs."""
from __future__ import annotations

from dataclasses import dataclass

from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.schemes import Scheme


@dataclass
class Layout:
    """How the engine spreads the model: tensor parallel x data parallel, experts optionally EP."""

    tp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp


def draft_loaded(engine) -> bool:
    """Whether the engine loads an MTP draft (``engine.speculative.method=mtp``): only then do the MTP
    tensors take GPU bytes and cache KV. vLLM's main models of the families with an MTP block drop its
    tensors (their weight mappers map them to None, or skip the layers past num_hidden_layers); the
    draft model loads them."""
    return getattr(getattr(engine, "speculative", None), "method", None) == "mtp"


def group_bytes(group: TensorGroup, scheme: Scheme, fp8_ue8m0: bool = True) -> int:
    """Stored bytes of one group in ``scheme``, scales included (its storage codec counts them);
    a non-matrix group is kept as stored."""
    codec = scheme.codec if group.is_matrix else Scheme.PASSTHROUGH.codec
    return codec.stored_bytes(tuple(group.shape), group.dtype, fp8_ue8m0)


def shard_factor(group: TensorGroup, layout: Layout, tp_sharded: tuple[str, ...]) -> int:
    """How many GPUs share one copy of this group; ``tp_sharded``: the roles the model family's vLLM
    model splits across tensor-parallel ranks (``ModelFamily.tp_sharded_roles``)."""
    if group.role == "routed_experts":
        return layout.tp * layout.dp if layout.ep else layout.tp
    if group.role in tp_sharded:
        return layout.tp
    return 1
