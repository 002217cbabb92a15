"""The only place that asks the hardware what it is."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    """A target architecture. ``capability`` is the CUDA compute capability, None on CPU.

    ``family`` is the arch-specific suffix: 'a' (sm_100a: every arch-specific instruction,
    e.g. tcgen05.mma kind::mxf4nvf4), 'f' (family-portable sm_100f, which lacks them) or ''.
    """

    name: str
    capability: tuple[int, int] | None
    family: str = ""

    @property
    def is_cuda(self) -> bool:
        return self.capability is not None

    @property
    def sm(self) -> int | None:
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def at_least(self, major: int, minor: int = 0) -> bool:
        return self.capability is not None and self.capability >= (major, minor)

    def __str__(self) -> str:
        return self.name


KNOWN_ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("cpu", None),
        Arch("sm80", (8, 0)),
        Arch("sm89", (8, 9)),
        Arch("sm90", (9, 0), "a"),
        Arch("sm100a", (10, 0), "a"),
        Arch("sm100f", (10, 0), "f"),
        Arch("sm103a", (10, 3), "a"),
        Arch("sm120", (12, 0), "a"),
    )
}


def detect() -> Arch:
    """The arch of the first visible CUDA device, or cpu."""
    import torch

    if not torch.cuda.is_available():
        return KNOWN_ARCHS["cpu"]
    major, minor = torch.cuda.get_device_capability(0)
    # A real device runs arch-specific code built for its exact capability ('a' targets).
    for arch in KNOWN_ARCHS.values():
        if arch.capability == (major, minor) and arch.family in ("a", ""):
            return arch
    return Arch(f"sm{major}{minor}", (major, minor), "a")


def resolve(name: str) -> Arch:
    """Map a config value ('auto', 'cpu', 'sm90', 'sm100a', ...) to an Arch."""
    if name == "auto":
        return detect()
    try:
        return KNOWN_ARCHS[name]
    except KeyError:
        raise ValueError(
            f"arch={name!r} is not known; valid: auto, {', '.join(KNOWN_ARCHS)}"
        ) from None
