"""A storage format's codec: the one home of what a stored tensor group of that format is.

A codec says which tensors a group stores (suffixes of the group name: ``weight``,
``weight_scale``, ...), how to tell the format from a group's header entries, how many bytes a
group of a given logical shape takes (scales included), its bits per weight, and the group's
float32 value (dequantize) and quantize -> dequantize round trip (emulate), both through the
numerics in ``formats/<format>.py``. The planner, the doctor, the quantize report, the memory plan
and eval ask the codec of a scheme's ``storage`` rather than knowing formats themselves.

One codec per storage format and module (``formats/*_codec.py``), registered in ``CODECS`` under
its storage name; codecs are used as classes, never instantiated (like the kernel backends).
"""
from __future__ import annotations

import importlib
import math
from typing import ClassVar, Mapping, NamedTuple

import torch

from nvfp4stack.registry import Registry

_BUILTIN = ("nvfp4_codec", "mxfp4_codec", "fp8_block_codec", "unquantized_codec")


class Entry(NamedTuple):
    """One stored tensor as its safetensors header describes it."""

    dtype: str               # safetensors dtype name: 'U8', 'F8_E4M3', 'BF16', ...
    shape: tuple[int, ...]


class Codec:
    """One storage format; subclasses set the ClassVars and implement ``stored_bytes`` and
    ``dequantize`` (and ``detect``, ``emulate`` where the format has them)."""

    name: ClassVar[str] = ""
    suffixes: ClassVar[tuple[str, ...]] = ("weight",)  # the tensors one group stores, weight first
    packed: ClassVar[bool] = False                     # two values per stored weight byte along K
    bits_per_weight: ClassVar[float]                   # stored bits per weight, scales included
    # asked in this order (lowest first): a format whose tensors are a subset of another's goes later
    detect_order: ClassVar[int] = 50

    @classmethod
    def detect(cls, entries: Mapping[str, Entry]) -> bool:
        """Whether a group with these stored tensors (suffix -> Entry) is in this format. Partial
        groups (a lost scale) still answer from what is there, so the doctor can name what is missing."""
        return False

    @classmethod
    def logical_shape(cls, stored: tuple[int, ...]) -> tuple[int, ...]:
        """The weight's logical shape from its stored ``weight`` shape."""
        return (*stored[:-1], stored[-1] * 2) if cls.packed and stored else tuple(stored)

    @classmethod
    def stored_bytes(cls, shape: tuple[int, ...], dtype: str = "bf16", fp8_ue8m0: bool = True) -> int:
        """Bytes of one group of logical ``shape`` [..., N, K] stored in this format, scales included.
        ``dtype``: the logical dtype of a tensor kept as stored; ``fp8_ue8m0``: FP8 block scales
        stored as UE8M0 bytes (else fp32)."""
        raise NotImplementedError

    @classmethod
    def dequantize(cls, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        """The group's weight as float32 from its stored tensors (suffix -> tensor); ``name``: the
        group, for messages."""
        raise NotImplementedError

    @classmethod
    def emulate(cls, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``w`` [N, K] after a quantize -> dequantize round trip in this format."""
        raise ValueError(f"{name}: no emulation for storage format {cls.name!r}")

    @classmethod
    def describe(cls, entries: Mapping[str, Entry]) -> str:
        """How reports name the format of one group."""
        return cls.name


CODECS: Registry[type[Codec]] = Registry("codec")


_loaded = False


def load_codecs() -> None:
    """Import the built-in codec modules, which register them (once)."""
    global _loaded
    if not _loaded:
        for module in _BUILTIN:
            importlib.import_module(f"nvfp4stack.formats.{module}")
        _loaded = True


def codec_for(storage: str, where: str = "storage") -> type[Codec]:
    load_codecs()
    if storage not in CODECS:
        raise KeyError(f"{where}: no codec for storage format {storage!r}; registered: {CODECS.listing()}")
    return CODECS.get(storage)


def detect(entries: Mapping[str, Entry]) -> type[Codec] | None:
    """The codec of one stored group (suffix -> Entry; '' or 'weight' for the weight), None when
    no codec can tell (packed E2M1 without any scale is NVFP4 or MXFP4: the caller decides)."""
    load_codecs()
    for codec in sorted((CODECS.get(n) for n in CODECS.names()), key=lambda c: (c.detect_order, c.name)):
        if codec.detect(entries):
            return codec
    return None


def group_suffixes() -> tuple[str, ...]:
    """Every registered codec's stored-tensor suffixes, longest first (the order to strip them in)."""
    load_codecs()
    codecs = tuple(CODECS.get(n) for n in CODECS.names())
    if codecs not in _suffix_cache:   # asked once per stored tensor: keep it a dict hit
        sufs = {s for c in codecs for s in c.suffixes}
        _suffix_cache.clear()
        _suffix_cache[codecs] = tuple(sorted(sufs, key=lambda s: (-len(s), s)))
    return _suffix_cache[codecs]


_suffix_cache: dict[tuple, tuple[str, ...]] = {}


def require(tensors: Mapping, keys, name: str, fmt: str) -> None:
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise KeyError(f"{name}: {fmt} group needs {', '.join(f'{name}.{k}' for k in missing)}; "
                       f"found {sorted(tensors)}. Check the plan picked the right converter")


def batches(shape: tuple[int, ...]) -> int:
    """How many [N, K] matrices a [..., N, K] shape stacks."""
    return math.prod(shape[:-2]) if len(shape) > 2 else 1
