"""A toy storage format added from outside the package, the way a new format is added: its codec,
its scheme, a converter into it and a kernel that serves it, all in this one file.

toy_int8: ``weight`` int8 [..., N, K] and ``row_scale`` bf16 [..., N], value = weight * row_scale.
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Mapping

import torch

from nvfp4stack import schemes
from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.formats.codec import CODECS, Codec, Entry, load_codecs, require
from nvfp4stack.kernels.base import LINEAR_BACKENDS, Capabilities, RunnableLinearBackend, load_backends
from nvfp4stack.schemes import Scheme

NAME = "toy_int8"
CONVERTER = "bf16_to_toy_int8"
KERNEL = "toy_int8_emulation"


def quantize_toy(w: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise symmetric int8: (int8 [..., N, K], bf16 scale [..., N])."""
    if not w.is_floating_point():
        raise ValueError(f"{name}: expected a float weight to quantize, found {w.dtype}")
    scale = (w.float().abs().amax(-1) / 127).clamp(min=1e-8).to(torch.bfloat16)   # [..., N]
    q = torch.round(w.float() / scale.float().unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q, scale


class ToyInt8Codec(Codec):
    suffixes = ("weight", "row_scale")
    bits_per_weight = 8 + 16 / 128   # one bf16 scale per row; rows of 128 and more in practice
    detect_order = 40

    @classmethod
    def detect(cls, entries: Mapping[str, Entry]) -> bool:
        w = entries.get("weight")
        return w is not None and w.dtype == "I8" and "row_scale" in entries

    @classmethod
    def stored_bytes(cls, shape: tuple[int, ...], dtype: str = "bf16", fp8_ue8m0: bool = True) -> int:
        return math.prod(shape) + 2 * math.prod(shape[:-1])

    @classmethod
    def dequantize(cls, tensors: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        require(tensors, ("weight", "row_scale"), name, NAME)
        return tensors["weight"].float() * tensors["row_scale"].float().unsqueeze(-1)

    @classmethod
    def emulate(cls, w: torch.Tensor, name: str, global_scale: torch.Tensor | None = None) -> torch.Tensor:
        q, scale = quantize_toy(w, name)
        return cls.dequantize({"weight": q, "row_scale": scale}, name)


class Bf16ToToyInt8(Converter):
    source: ClassVar[Scheme] = Scheme.BF16
    target: ClassVar[Scheme]     # the toy scheme, set when it is registered

    def convert(self, tensors: dict, name: str) -> dict:
        require(tensors, ("weight",), name, "bf16")
        q, scale = quantize_toy(tensors["weight"], f"{name}.weight")
        return {"weight": q, "row_scale": scale}


class ToyInt8Linear(RunnableLinearBackend):
    # the toy scheme replaces BF16 when register_toy_codec registers it
    capabilities = Capabilities(provider="nvfp4stack", schemes=(Scheme.BF16,), emulated=True)

    @classmethod
    def supports_arch(cls, arch) -> tuple[bool, str]:
        return True, "pure torch dequantize + GEMM, any device"

    @classmethod
    def prepare(cls, weights: dict, **options) -> torch.Tensor:
        return ToyInt8Codec.dequantize(weights, "toy linear")

    @classmethod
    def apply(cls, prepared: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (x.float() @ prepared.t()).to(x.dtype)


def register_toy_codec(monkeypatch) -> Scheme:
    """Register the toy_int8 scheme, codec, converter and linear kernel until the test ends; returns
    the scheme."""
    import nvfp4stack.convert  # noqa: F401  (the built-in converters first: the entries below are removed after)

    load_codecs()
    load_backends()
    monkeypatch.setattr(schemes, "_REGISTRY", dict(schemes._REGISTRY))
    toy = Scheme.register(NAME, storage=NAME, activation="bf16")
    monkeypatch.setattr(Bf16ToToyInt8, "target", toy, raising=False)
    monkeypatch.setattr(ToyInt8Linear, "capabilities",
                        dataclasses.replace(ToyInt8Linear.capabilities, schemes=(toy,)))
    for registry, name, obj in ((CODECS, NAME, ToyInt8Codec), (CONVERTERS, CONVERTER, Bf16ToToyInt8),
                                (LINEAR_BACKENDS, KERNEL, ToyInt8Linear)):
        monkeypatch.setitem(registry._items, name, obj)
        obj.name = name
    return toy
