"""What each work unit will write, known before it is converted, so a shard's header can go first.

A pass-through unit writes its input's headers. A converted unit's output tensors (names, dtypes,
shapes) depend only on its converter and its inputs' keys, dtypes and shapes, so they are found
once per such signature, by converting the first unit of that signature (one unit's read; a few per
checkpoint), or, where that fails (bad data: the real run reports it), on meta tensors. Not meta
first: torch's meta kernels import torch._dynamo on first use, about a second of every convert.
A wrong guess costs only a second write of one shard (``shard_writer``), never other bytes.
"""
from __future__ import annotations

import logging

import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.convert.base import Converter
from nvfp4stack.convert.shard_writer import TensorSpec, tensor_spec
from nvfp4stack.convert.units import PASSTHROUGH, Unit, join_name

log = logging.getLogger(__name__)


class OutputSpecs:
    """``unit`` -> its output TensorSpecs in writing order (or None when they cannot be known)."""

    def __init__(self, reader: ShardedReader, converters: dict[str, Converter], device: torch.device):
        self._reader, self._converters, self._device = reader, converters, device
        self._by_signature: dict[tuple, list[tuple] | None] = {}

    def of(self, unit: Unit) -> list[TensorSpec] | None:
        infos = self._reader.infos
        if unit.converter == PASSTHROUGH:
            return [TensorSpec(name, infos[name].dtype, tuple(infos[name].shape), infos[name].nbytes)
                    for name, _ in unit.members]
        signature = (unit.converter, tuple((local, infos[name].dtype, tuple(infos[name].shape))
                                           for name, local in unit.members))
        if signature not in self._by_signature:
            self._by_signature[signature] = self._convert_for_specs(unit, meta=False) or \
                self._convert_for_specs(unit, meta=True)
        local = self._by_signature[signature]
        if local is None:
            return None
        return [TensorSpec(join_name(unit.prefix, key), dtype, shape, n) for key, dtype, shape, n in local]

    def _convert_for_specs(self, unit: Unit, meta: bool) -> list[tuple] | None:
        conv = self._converters[unit.converter]
        infos = self._reader.infos
        try:
            if meta:
                group = {local: torch.empty(infos[name].shape, dtype=infos[name].torch_dtype, device="meta")
                         for name, local in unit.members}
            else:
                group = {local: self._reader.get(name, self._device) for name, local in unit.members}
            with torch.inference_mode():
                out = conv.convert(group, unit.prefix)
            return [(key, *tensor_spec(key, t)[1:]) for key, t in out.items()]
        except Exception as e:  # noqa: BLE001 - bad data or a meta-less op; the real run reports real errors
            if meta:
                log.debug("%s: output specs unknown (%s: %s); its shard may be written twice",
                          unit.prefix, type(e).__name__, e)
            return None
        finally:
            conv.report = None

    def span(self, units: list[Unit], start: int, max_shard_bytes: int) -> tuple[list[TensorSpec], int, bool]:
        """The shard that opens at ``units[start]`` under the stream's own closing rule (units up to the
        one that takes it to ``max_shard_bytes``): its tensors, the unit after its last, and whether every
        unit's specs were known (False: it stops before the first unit whose specs are unknown)."""
        out: list[TensorSpec] = []
        total = 0
        for i in range(start, len(units)):
            specs = self.of(units[i])
            if specs is None:
                return out, i, False
            out += specs
            total += sum(s.nbytes for s in specs)
            if total >= max_shard_bytes:
                return out, i + 1, True
        return out, len(units), True

    def shard(self, units: list[Unit], start: int, max_shard_bytes: int) -> list[TensorSpec]:
        """The tensors of the shard that opens at ``units[start]`` (``span``); where some unit's specs are
        unknown, those before it: the writer finds out on closing and fixes the header."""
        return self.span(units, start, max_shard_bytes)[0]
