"""Kernel backend contract: one backend per file, selected by name or by per-arch priority."""
from __future__ import annotations

from typing import ClassVar

from nvfp4stack.arch import Arch
from nvfp4stack.registry import Registry
from nvfp4stack.schemes import Scheme

Verdict = tuple[bool, str]


class KernelBackend:
    """A way to run one kind of layer (``kind`` = 'moe' or 'linear').

    Subclasses answer two questions with ``(ok, reason)``; the reason is printed in plans and
    errors, so it says what is needed, not just 'no'.
    ``provider`` is 'vllm' for backends vLLM already has (selected through its own flags) and
    'nvfp4stack' for the ones this package implements.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    provider: ClassVar[str] = "vllm"
    schemes: ClassVar[tuple[Scheme, ...]] = ()
    vllm_moe_backend: ClassVar[str | None] = None  # value for vLLM's --moe-backend, if any
    vllm_linear_backend: ClassVar[str | None] = None  # value for vLLM's --linear-backend, if any
    # True when the kernel quantizes activations to FP4 (W4A4): needs FP4 tensor cores unless
    # ``emulated``. Weight-only kernels run NVFP4 checkpoints with bf16 activations.
    activation_fp4: ClassVar[bool] = False
    emulated: ClassVar[bool] = False

    @classmethod
    def is_supported(cls, arch: Arch) -> Verdict:
        raise NotImplementedError

    @classmethod
    def can_implement(cls, scheme: Scheme, shape: tuple[int, ...] | None = None) -> Verdict:
        if scheme not in cls.schemes:
            return False, (
                f"{cls.name} runs {', '.join(s.value for s in cls.schemes)}, not {scheme.value}"
            )
        return True, "ok"

    @classmethod
    def supports_scheme_on(cls, scheme: Scheme, arch: Arch) -> Verdict:
        """Scheme x arch limits that neither question alone captures (default: none)."""
        return True, "ok"

    @classmethod
    def warm_up_moe(cls, w13, w2, *, top_k: int, max_tokens: int, swiglu_limit: float | None,
                    fp8_weights=None) -> list[int]:
        """MoE backends that JIT-compile: compile at load every binary a forward of up to
        ``max_tokens`` tokens can need, so none compiles mid-request. Returns the token counts
        run (default: nothing to compile)."""
        return []


MOE_BACKENDS: Registry[type[KernelBackend]] = Registry("moe backend")
LINEAR_BACKENDS: Registry[type[KernelBackend]] = Registry("linear backend")


def registry_for(kind: str) -> Registry[type[KernelBackend]]:
    return {"moe": MOE_BACKENDS, "linear": LINEAR_BACKENDS}[kind]


MXF4NVF4_ARCHS = ("sm100a", "sm103a")


class VllmBackend(KernelBackend):
    """A backend vLLM already ships; we only decide when it applies and pass vLLM's flag.

    Subclasses are data: ``archs`` (exact arch names, for arch-specific instructions) or
    ``min_capability`` (for portable kernels), and ``activation_fp4`` when the kernel
    quantizes activations to FP4 (W4A4), which Hopper cannot do.
    """

    provider = "vllm"
    archs: ClassVar[tuple[str, ...] | None] = None
    min_capability: ClassVar[tuple[int, int]] = (8, 0)
    needs: ClassVar[str] = ""  # why the arch restriction exists, shown in refusals

    @classmethod
    def is_supported(cls, arch: Arch) -> Verdict:
        if not arch.is_cuda:
            return False, f"{cls.name} is a CUDA kernel in vLLM; arch {arch} has no CUDA GPU"
        if cls.archs is not None:
            if arch.name in cls.archs:
                return True, f"{arch} is one of {', '.join(cls.archs)}"
            return False, f"{cls.name} needs {' or '.join(cls.archs)} ({cls.needs}); arch is {arch}"
        if not arch.at_least(*cls.min_capability):
            cap = "sm%d%d" % cls.min_capability
            return False, f"{cls.name} needs {cap} or newer ({cls.needs}); arch is {arch}"
        return True, f"{arch} >= sm{cls.min_capability[0]}{cls.min_capability[1]}"
