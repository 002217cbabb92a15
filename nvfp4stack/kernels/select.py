"""Backend selection: an explicit choice is validated, ``auto`` walks the per-arch priority list."""
from __future__ import annotations

from dataclasses import dataclass, field

from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import KernelBackend, load_backends, registry_for
from nvfp4stack.kernels.priority import priority
from nvfp4stack.schemes import Scheme
from nvfp4stack.usage import did_you_mean


class BackendError(ValueError):
    """No backend (or not the chosen one) can run a scheme on an arch."""


@dataclass
class Selection:
    backend: str
    served_scheme: Scheme                    # what actually runs (NVFP4 on Hopper runs W4A16)
    reason: str
    rejected: dict[str, str] = field(default_factory=dict)  # backend -> why not


def served_scheme(backend: type[KernelBackend], scheme: Scheme) -> Scheme:
    """W4A4 checkpoints run weight-only (bf16 activations) on weight-only kernels."""
    if scheme is Scheme.NVFP4 and not backend.capabilities.activation_fp4:
        return Scheme.NVFP4_W4A16
    return scheme


def select_backend(kind: str, choice: str, arch: Arch, scheme: Scheme, key: str | None = None) -> Selection:
    """Pick the ``kind`` ('moe' or 'linear') backend for ``scheme`` on ``arch``.

    Raises BackendError naming the config key, every rejected backend and its reason.
    """
    load_backends()
    reg = registry_for(kind)
    key = key or f"backend.{kind}"
    if choice != "auto":
        backend = reg.get(choice) if choice in reg else None
        if backend is None:
            raise BackendError(f"{key}={choice!r} is not a {kind} backend; valid: auto, {reg.listing()}"
                               f"{did_you_mean(choice, reg.spellings(), f'{key}=')}")
        ok, why = backend.is_supported(arch, scheme)
        if not ok:
            alternatives = [n for n in priority(kind, arch.name)
                            if n in reg and reg.get(n).is_supported(arch, scheme)[0]]
            raise BackendError(
                f"{key}={choice} cannot run {scheme.value} on {arch}: {why}. "
                f"Fix: set {key}=auto" + (f" (would pick {alternatives[0]})" if alternatives else "")
                + (f" or one of: {', '.join(alternatives)}" if len(alternatives) > 1 else "")
            )
        return Selection(backend.name, served_scheme(backend, scheme), why)
    rejected: dict[str, str] = {}
    for name in priority(kind, arch.name):
        if name not in reg:
            rejected[name] = "not registered"
            continue
        backend = reg.get(name)
        ok, why = backend.is_supported(arch, scheme)
        if ok:
            return Selection(name, served_scheme(backend, scheme), f"auto: first valid on {arch} ({why})", rejected)
        rejected[name] = why
    detail = "; ".join(f"{n}: {r}" for n, r in rejected.items()) or "no candidates"
    raise BackendError(f"{key}=auto found no {kind} backend for {scheme.value} on {arch}: {detail}")
