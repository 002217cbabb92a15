"""Kernel backend interface: one abstract base per kind of layer (MoE, linear), one backend per module.

A backend answers ``is_supported(arch, scheme) -> (ok, reason)`` and runs a layer in two steps,
as vLLM's ``FusedMoEMethodBase`` does (``process_weights_after_loading`` then ``apply``):
``prepare`` puts the loaded weights into the kernel's layout once, ``apply`` runs the kernel on
them. Backends whose kernels vLLM itself runs (``provider = "vllm"``) are declarations: they say
which vLLM flag value selects them and refuse ``prepare``/``apply``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from nvfp4stack.arch import Arch
from nvfp4stack.registry import Registry
from nvfp4stack.schemes import Scheme

Verdict = tuple[bool, str]
PROVIDERS = ("vllm", "nvfp4stack")
MXF4NVF4_ARCHS = ("sm100a", "sm103a")
FP4_TENSOR_CORE_ARCHS = MXF4NVF4_ARCHS + ("sm120",)


class KernelBackend(ABC):
    """A way to run one kind of layer; subclasses are used as classes, never instantiated.

    Every backend declares ``provider``: 'vllm' where vLLM runs the kernel (selected through its
    own flags), 'nvfp4stack' where this package implements ``prepare``/``apply``. Reasons are
    printed in plans and errors, so they say what is needed, not just 'no'.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str]
    provider: ClassVar[str]  # no default: each backend says who runs it
    schemes: ClassVar[tuple[Scheme, ...]] = ()
    # True when the kernel quantizes activations to FP4 (W4A4): needs FP4 tensor cores unless
    # ``emulated``. Weight-only kernels run NVFP4 checkpoints with bf16 activations.
    activation_fp4: ClassVar[bool] = False
    emulated: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
        """Whether the kernel runs on ``arch`` at all."""

    @classmethod
    def can_implement(cls, scheme: Scheme) -> Verdict:
        """Whether the kernel runs ``scheme`` (on some arch)."""
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
    def is_supported(cls, arch: Arch, scheme: Scheme) -> Verdict:
        """Whether this backend may run ``scheme`` on ``arch``; the reason either way."""
        checks = (cls.supports_arch(arch), cls.can_implement(scheme), cls.supports_scheme_on(scheme, arch))
        for ok, why in checks:
            if not ok:
                return False, why
        if scheme is Scheme.NVFP4 and cls.activation_fp4 and not cls.emulated \
                and arch.name not in FP4_TENSOR_CORE_ARCHS:
            return False, (f"{cls.name} runs NVFP4 as W4A4, but {arch} has no FP4 tensor cores: "
                           "sm_90 and older get weight-only NVFP4 only (marlin, triton_w4a16)")
        return True, checks[0][1]

    @classmethod
    @abstractmethod
    def prepare(cls, weights: Any, **options: Any) -> Any:
        """The loaded weights in the kernel's layout, built once at load."""

    @classmethod
    @abstractmethod
    def apply(cls, prepared: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run the layer on ``prepared`` weights."""


@dataclass(frozen=True)
class MoeWeights:
    """Routed experts as the checkpoint stores them (stacked; see formats/).

    w13: NVFP4 or MXFP4 [E, 2I, H], rows 0..I-1 gate (w1), I..2I-1 up (w3); w2: same format [E, H, I].
    a13_scale, a2_scale: [E] static activation input scales (W4A4), None for weight-only.
    """

    w13: Any
    w2: Any
    a13_scale: torch.Tensor | None = None
    a2_scale: torch.Tensor | None = None


class MoeBackend(KernelBackend):
    """Routed-expert MLP: sum_j topk_weights[t, j] * w2_e(swiglu(w13_e x_t)), e = topk_ids[t, j]."""

    kind = "moe"
    vllm_moe_backend: ClassVar[str | None] = None  # value of vLLM's --moe-backend, if any
    # apply takes -1 in topk_ids (a slot routed to another rank's expert under expert parallelism) and
    # computes nothing for it; False: the caller maps such slots to expert 0 with weight 0
    skips_negative_ids: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def prepare(cls, weights: MoeWeights, *, fp8_prefill: bool = False) -> Any:
        """``weights`` in the kernel's layout; ``fp8_prefill`` asks for the FP8 prefill copy
        where the backend has that mode (a backend without it raises ValueError)."""

    @classmethod
    @abstractmethod
    def apply(cls, prepared: Any, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              swiglu_limit: float | None = None, activation: str = "silu") -> torch.Tensor:
        """x: [T, H]; topk_weights, topk_ids: [T, k] (local expert ids) -> [T, H] in x.dtype.
        ``swiglu_limit``: clamped SwiGLU (gate <= limit, |up| <= limit), None for plain SwiGLU."""

    @classmethod
    def warm_up(cls, prepared: Any, *, top_k: int, max_tokens: int, swiglu_limit: float | None) -> list[int]:
        """Backends that JIT-compile: compile at load every binary a forward of up to
        ``max_tokens`` tokens can need, so none compiles mid-request. Returns the token counts
        run (default: nothing to compile)."""
        return []


class LinearBackend(KernelBackend):
    """``x @ W.T (+ bias)`` for one quantized weight."""

    kind = "linear"
    vllm_linear_backend: ClassVar[str | None] = None  # value of vLLM's --linear-backend, if any

    @classmethod
    @abstractmethod
    def prepare(cls, weight: Any, bias: torch.Tensor | None = None) -> Any:
        """A typed weight [N, K] (Nvfp4Tensor, Fp8BlockTensor, ...) and optional bias [N] in
        the kernel's layout."""

    @classmethod
    @abstractmethod
    def apply(cls, prepared: Any, x: torch.Tensor) -> torch.Tensor:
        """x: [..., K] -> [..., N] in x.dtype."""


MOE_BACKENDS: Registry[type[MoeBackend]] = Registry("moe backend")
LINEAR_BACKENDS: Registry[type[LinearBackend]] = Registry("linear backend")


def registry_for(kind: str) -> Registry:
    return {"moe": MOE_BACKENDS, "linear": LINEAR_BACKENDS}[kind]


def load_backends() -> None:
    """Import every backend module, which registers it; none imports anything heavy at module level."""
    import nvfp4stack.kernels.linear  # noqa: F401
    import nvfp4stack.kernels.moe  # noqa: F401
