"""Backends vLLM ships: declarations of when vLLM's kernel applies and which vLLM flag selects it.

vLLM runs these kernels inside its own FusedMoE / LinearMethod (it prepares the weights in its
``process_weights_after_loading`` and applies them in its ``apply``), so ``prepare`` and ``apply``
here refuse with the reason.
"""
from __future__ import annotations

from typing import Any, ClassVar, NoReturn

from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import KernelBackend, LinearBackend, MoeBackend, Verdict


class VllmBackend(KernelBackend):
    """Data, not code: ``archs`` (exact arch names, for arch-specific instructions) or
    ``min_capability`` (for portable kernels), and ``activation_fp4`` when the kernel quantizes
    activations to FP4 (W4A4), which Hopper cannot do."""

    provider = "vllm"
    archs: ClassVar[tuple[str, ...] | None] = None
    min_capability: ClassVar[tuple[int, int]] = (8, 0)
    needs: ClassVar[str] = ""  # why the arch restriction exists, shown in refusals

    @classmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
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

    @classmethod
    def _runs_inside_vllm(cls, verb: str) -> NoReturn:
        flag = getattr(cls, f"vllm_{cls.kind}_backend", None)
        raise NotImplementedError(
            f"{cls.kind} backend {cls.name}: vLLM runs this kernel inside its own "
            f"{'FusedMoE' if cls.kind == 'moe' else 'linear method'} (--{cls.kind}-backend {flag}); "
            f"nvfp4stack does not {verb} it. Use a provider='nvfp4stack' backend "
            "(torch_emulation, triton_w4a16) to run a layer here"
        )

    @classmethod
    def prepare(cls, weights: Any, *args: Any, **options: Any) -> NoReturn:
        cls._runs_inside_vllm("prepare weights for")

    @classmethod
    def apply(cls, prepared: Any, x: Any, *args: Any, **kwargs: Any) -> NoReturn:
        cls._runs_inside_vllm("apply")


class VllmMoeBackend(VllmBackend, MoeBackend):
    """A vLLM MoE kernel; subclasses set ``vllm_moe_backend`` (vLLM's --moe-backend value)."""


class VllmLinearBackend(VllmBackend, LinearBackend):
    """A vLLM linear kernel; subclasses set ``vllm_linear_backend`` (vLLM's --linear-backend value)."""
