"""Precision schemes a tensor group can be planned to: a storage format x an activation precision.

A scheme's ``storage`` names its codec (``nvfp4stack/formats/codec.py`` ``CODECS``): the stored
tensors, their bytes and their value. ``activation`` is what the kernel feeds the GEMM. NVFP4 and
NVFP4_W4A16 share the nvfp4 storage, so the same bytes serve both (compare ``.storage``).

The built-in schemes are class attributes; a new storage format adds its scheme with
``Scheme.register`` next to its codec; the scheme spelled like a codec's name is that storage's
own scheme (what detection returns). Schemes behave like the str enum they replaced: interned
(compare with ``is``), ``Scheme("nvfp4")`` looks one up, ``.value`` is the config spelling.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Iterator, Mapping

if TYPE_CHECKING:
    from nvfp4stack.formats.codec import Codec, Entry

ACTIVATIONS = ("bf16", "fp8", "fp4")
_REGISTRY: dict[str, "Scheme"] = {}   # value -> scheme, in registration order


class _SchemeRegistry(type):
    """``for s in Scheme`` and ``len(Scheme)`` walk the registered schemes, as they did the enum."""

    def __iter__(cls) -> Iterator["Scheme"]:
        return iter(list(_REGISTRY.values()))

    def __len__(cls) -> int:
        return len(_REGISTRY)


class Scheme(str, metaclass=_SchemeRegistry):
    """One registered precision scheme; its str value is the config spelling ('nvfp4_w4a16')."""

    storage: str       # the codec name of the stored tensors
    activation: str    # one of ACTIVATIONS

    NVFP4: ClassVar["Scheme"]        # W4A4: E2M1 weights + UE4M3/16 scales + fp32 global; activations NVFP4
    NVFP4_W4A16: ClassVar["Scheme"]  # NVFP4 weights, bf16 activations (the only NVFP4 path on sm_90)
    MXFP4: ClassVar["Scheme"]        # E2M1 + UE8M0 per 32 (the format some releases ship routed experts in)
    FP8_BLOCK: ClassVar["Scheme"]    # E4M3 with 128x128 block scales (UE8M0 or fp32)
    BF16: ClassVar["Scheme"]
    PASSTHROUGH: ClassVar["Scheme"]  # copied byte for byte, whatever it is

    def __new__(cls, value: str) -> "Scheme":
        try:
            return _REGISTRY[value]
        except (KeyError, TypeError):
            raise ValueError(f"{value!r} is not a valid Scheme") from None

    @classmethod
    def register(cls, value: str, *, storage: str, activation: str) -> "Scheme":
        """Add the scheme ``value`` (storage codec name x activation); returns it. Registering the
        same definition again returns the registered scheme."""
        if activation not in ACTIVATIONS:
            raise ValueError(f"scheme {value!r}: activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        old = _REGISTRY.get(value)
        if old is not None:
            if (old.storage, old.activation) != (storage, activation):
                raise ValueError(f"scheme {value!r} is registered twice ({old.storage} x {old.activation} and "
                                 f"{storage} x {activation}); give one of them another name")
            return old
        scheme = str.__new__(cls, value)
        scheme.storage, scheme.activation = storage, activation
        _REGISTRY[value] = scheme
        return scheme

    @classmethod
    def parse(cls, value: str, where: str = "scheme") -> "Scheme":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{where}: unknown scheme {value!r}; valid: {', '.join(s.value for s in cls)}"
            ) from None

    @classmethod
    def names(cls) -> list[str]:
        """Every registered scheme's config spelling, in registration order."""
        return list(_REGISTRY)

    @classmethod
    def detect(cls, entries: Mapping[str, "Entry"]) -> "Scheme | None":
        """The storage scheme of one stored group (suffix -> Entry), None when no codec can tell;
        the one detection the planner, the doctor and the quantize report share."""
        from nvfp4stack.formats.codec import detect

        codec = detect(entries)
        return None if codec is None else cls(codec.name)

    @property
    def value(self) -> str:
        return str.__str__(self)

    @property
    def name(self) -> str:
        return self.value.upper()

    @property
    def codec(self) -> type["Codec"]:
        from nvfp4stack.formats.codec import codec_for

        return codec_for(self.storage, f"scheme {self.value}")

    @property
    def is_nvfp4(self) -> bool:
        return self.storage == "nvfp4"

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, scales included."""
        return self.codec.bits_per_weight

    # The enum's spellings, kept so that messages and sort keys built from them do not change.
    def __str__(self) -> str:
        return f"Scheme.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"<Scheme.{self.name}: {self.value!r}>"

    def __reduce__(self):
        return Scheme, (self.value,)

    def __copy__(self) -> "Scheme":
        return self

    def __deepcopy__(self, memo) -> "Scheme":
        return self


Scheme.NVFP4 = Scheme.register("nvfp4", storage="nvfp4", activation="fp4")
Scheme.NVFP4_W4A16 = Scheme.register("nvfp4_w4a16", storage="nvfp4", activation="bf16")
Scheme.MXFP4 = Scheme.register("mxfp4", storage="mxfp4", activation="bf16")
Scheme.FP8_BLOCK = Scheme.register("fp8_block", storage="fp8_block", activation="fp8")
Scheme.BF16 = Scheme.register("bf16", storage="bf16", activation="bf16")
Scheme.PASSTHROUGH = Scheme.register("passthrough", storage="passthrough", activation="bf16")
