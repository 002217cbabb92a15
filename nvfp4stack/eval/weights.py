"""Emulated weights as the plan makes them: from the source checkpoint's own bytes, through the
plan's conversion, compared against the BF16 reference.

A BF16 source is quantized like modelopt (``reference.emulate_weight``). A quantized source (the
FP8-block or MXFP4 release) starts from its stored values, not from the BF16 reference, so a BF16
target shows the release's own error and a same-format target passes its bytes through. MXFP4 ->
NVFP4 goes through the planner's converter, ``mxfp4_to_nvfp4``, which is exact wherever a block's
exponent fits E4M3.
"""
from __future__ import annotations

from pathlib import Path

import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.convert.groups import mxfp4_from_group
from nvfp4stack.convert.mxfp4_to_nvfp4 import mxfp4_to_nvfp4
from nvfp4stack.eval.emulate import emulate_weight
from nvfp4stack.formats.mxfp4 import Mxfp4Tensor
from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR, Nvfp4Tensor, quantize_nvfp4
from nvfp4stack.quantize.report import dequantize_group
from nvfp4stack.schemes import Scheme


class PlannedWeights:
    """group -> emulated weight, given each group's stored (source) scheme and the source dir."""

    def __init__(self, sources: dict[str, Scheme], source_dir: str | Path | None):
        self.sources = sources
        self.source_dir = Path(source_dir) if source_dir is not None else None
        self._reader: ShardedReader | None = None
        self.inexact_blocks = 0  # MXFP4 -> NVFP4 blocks that had to be re-rounded

    @property
    def reader(self) -> ShardedReader:
        if self._reader is None:
            if self.source_dir is None:
                raise ValueError("PlannedWeights: a quantized source needs source_dir (the checkpoint it was "
                                 "read from); pass the model's checkpoint directory")
            self._reader = ShardedReader(self.source_dir)
        return self._reader

    def source_of(self, group: str) -> Scheme:
        return self.sources.get(group, Scheme.BF16)

    def _mxfp4(self, group: str) -> Mxfp4Tensor:
        r = self.reader
        return mxfp4_from_group({"weight": r.get(group + ".weight"), "scale": r.get(group + ".scale")}, group)

    def cast(self, m: Mxfp4Tensor) -> Nvfp4Tensor:
        q, rep = mxfp4_to_nvfp4(m)
        self.inexact_blocks += rep["inexact_blocks"]
        return q

    def emulate(self, w: torch.Tensor, scheme: Scheme, name: str,
                global_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``reference.emulate_weight``'s signature: ``w`` is the BF16 reference value of ``name``."""
        source = self.source_of(name)
        if source in (Scheme.BF16, Scheme.PASSTHROUGH) or scheme is Scheme.PASSTHROUGH:
            return emulate_weight(w, scheme, name, global_scale)
        if source is Scheme.MXFP4 and scheme.is_nvfp4:
            return self.cast(self._mxfp4(name)).dequantize(torch.float32).to(w.dtype)
        stored = dequantize_group(self.reader, name + ".weight")
        if stored.shape != w.shape:
            raise ValueError(f"{name}: the source checkpoint {self.source_dir} stores shape {tuple(stored.shape)}, "
                             f"the BF16 reference {tuple(w.shape)}; eval.reference_path must be the BF16 "
                             "checkpoint of the same model")
        if scheme is source or scheme is Scheme.BF16:
            return stored.to(w.dtype)
        return emulate_weight(stored.to(w.dtype), scheme, name, global_scale)

    def experts_nvfp4(self, layer_prefix: str, n_experts: int, gate_up: torch.Tensor, down: torch.Tensor,
                      proj: tuple[str, str, str]) -> tuple[Nvfp4Tensor, Nvfp4Tensor]:
        """Stacked NVFP4 (w13 [E, 2I, H], w2 [E, H, I]) for a MoE kernel; gate and up share one global
        scale per expert. ``gate_up`` / ``down`` are the BF16 reference weights; ``proj``: the family's
        (gate, up, down) names of an expert's projections, ``{layer_prefix}.{e}.{name}``."""
        names = [[f"{layer_prefix}.{e}.{p}" for e in range(n_experts)] for p in proj]
        if all(self.source_of(n) is Scheme.MXFP4 for ns in names for n in ns):
            mx = [[self._mxfp4(n) for n in ns] for ns in names]
            w13 = _stack([Mxfp4Tensor(torch.cat([a.data, b.data]), torch.cat([a.scale, b.scale]),
                                      (a.shape[0] + b.shape[0], a.shape[1])) for a, b in zip(mx[0], mx[1])])
            return self.cast(w13), self.cast(_stack(mx[2]))
        w13_f = gate_up.detach().float()                                   # [E, 2I, H]
        w1, w3 = w13_f.chunk(2, dim=1)
        gs13 = torch.maximum(w1.abs().flatten(1).amax(1), w3.abs().flatten(1).amax(1)) / GLOBAL_DIVISOR
        gs13 = torch.where(gs13 == 0, torch.ones_like(gs13), gs13)
        return (quantize_nvfp4(w13_f, gs13, name=f"{layer_prefix}.{proj[0]}+{proj[1]}"),
                quantize_nvfp4(down.detach().float(), name=f"{layer_prefix}.{proj[2]}"))


def _stack(ms: list[Mxfp4Tensor]) -> Mxfp4Tensor:
    return Mxfp4Tensor(torch.stack([m.data for m in ms]), torch.stack([m.scale for m in ms]), (len(ms), *ms[0].shape))
