"""Kernel backend interface: what a backend can do (its ``Capabilities``, data) apart from what it runs.

Every registered backend declares ``capabilities``: the schemes and archs it covers, who runs it
(``provider``), the vLLM flag value that selects it and the modes it has (FP8 prefill, negative
expert ids). ``is_supported(arch, scheme) -> (ok, reason)`` answers from that declaration.

Only backends nvfp4stack implements (``RunnableMoeBackend``, ``RunnableLinearBackend``) run a layer,
in two steps as vLLM's ``FusedMoEMethodBase`` does (``process_weights_after_loading`` then
``apply``): ``prepare`` puts the loaded weights into the kernel's layout once and returns the
backend's own prepared type, ``apply`` runs the kernel on it. Backends whose kernels vLLM runs
(``provider = "vllm"``, kernels/vllm_backend.py) are declarations only: they have no
``prepare``/``apply``; vLLM prepares and runs them inside its own methods.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

from nvfp4stack.arch import Arch
from nvfp4stack.registry import Registry
from nvfp4stack.schemes import Scheme

Verdict = tuple[bool, str]
PROVIDERS = ("vllm", "nvfp4stack")
MXF4NVF4_ARCHS = ("sm100a", "sm103a")
FP4_TENSOR_CORE_ARCHS = MXF4NVF4_ARCHS + ("sm120",)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, as data; nothing here runs a kernel.

    provider: 'vllm' (vLLM runs the kernel, selected by ``vllm_flag``) or 'nvfp4stack' (this package
    implements ``prepare``/``apply``). schemes: the schemes it runs.
    archs: the exact arch names it runs on (arch-specific instructions); min_capability: the oldest
    compute capability it runs on (portable kernels); arch_needs: why, shown in refusals. Both None:
    the backend's own ``supports_arch`` rule decides.
    activation_fp4: the kernel quantizes activations to FP4 (W4A4), which needs FP4 tensor cores
    unless ``emulated``; weight-only kernels run NVFP4 checkpoints with bf16 activations.
    vllm_flag: the value of vLLM's --moe-backend / --linear-backend that selects it (vLLM-provided only).
    negative_expert_ids (MoE): ``apply`` takes -1 in topk_ids (a slot routed to another rank's expert
    under expert parallelism) and computes nothing for it; False: the caller maps such slots to
    expert 0 with weight 0.
    fp8_prefill (MoE): ``prepare`` builds an FP8 prefill copy of the experts on request
    (``backend.moe_fp8_prefill``).
    """

    provider: str
    schemes: tuple[Scheme, ...]
    archs: tuple[str, ...] | None = None
    min_capability: tuple[int, int] | None = None
    arch_needs: str = ""
    activation_fp4: bool = False
    emulated: bool = False
    vllm_flag: str | None = None
    negative_expert_ids: bool = False
    fp8_prefill: bool = False

    def __post_init__(self):
        if self.provider not in PROVIDERS:
            raise ValueError(f"Capabilities.provider: expected one of {', '.join(PROVIDERS)}, found {self.provider!r}")
        if not self.schemes or not all(isinstance(s, Scheme) for s in self.schemes):
            raise ValueError(f"Capabilities.schemes: expected a non-empty tuple of Scheme, found {self.schemes!r}")
        if (self.provider == "vllm") != (self.vllm_flag is not None):
            raise ValueError(f"Capabilities.vllm_flag: a provider='vllm' backend names the vLLM flag value that "
                             f"selects it and an nvfp4stack one names none; found provider={self.provider!r}, "
                             f"vllm_flag={self.vllm_flag!r}")


class KernelBackend(ABC):
    """A way to run one kind of layer, declared; subclasses are used as classes, never instantiated.

    Reasons are printed in plans and errors, so they say what is needed, not just 'no'.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str]
    capabilities: ClassVar[Capabilities]  # no default: each backend declares what it can do

    @classmethod
    @abstractmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
        """Whether the kernel runs on ``arch`` at all."""

    @classmethod
    def can_implement(cls, scheme: Scheme) -> Verdict:
        """Whether the kernel runs ``scheme`` (on some arch)."""
        schemes = cls.capabilities.schemes
        if scheme not in schemes:
            return False, f"{cls.name} runs {', '.join(s.value for s in schemes)}, not {scheme.value}"
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
        caps = cls.capabilities
        if scheme is Scheme.NVFP4 and caps.activation_fp4 and not caps.emulated \
                and arch.name not in FP4_TENSOR_CORE_ARCHS:
            return False, (f"{cls.name} runs NVFP4 as W4A4, but {arch} has no FP4 tensor cores: "
                           "sm_90 and older get weight-only NVFP4 only (marlin, triton_w4a16)")
        return True, checks[0][1]


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


class RunnableMoeBackend(MoeBackend):
    """A MoE backend nvfp4stack runs: ``prepare`` once at load, ``apply`` every step.

    ``prepared_type`` is what ``prepare`` returns; the vLLM plugin carries it through its opaque op
    with the type's ``op_tensors()`` / ``from_op_tensors(...)`` (engine/moe_method.py).
    """

    prepared_type: ClassVar[type]

    @classmethod
    @abstractmethod
    def prepare(cls, weights: MoeWeights, *, fp8_prefill: bool = False, routed_experts: int = 0) -> Any:
        """``weights`` in the kernel's layout, as a ``prepared_type``. ``fp8_prefill`` asks for the FP8
        prefill copy (backends without ``capabilities.fp8_prefill`` raise ValueError); ``routed_experts``:
        the experts the router chooses among where that is more than these (all ranks' under expert
        parallelism), 0 otherwise."""

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


class RunnableLinearBackend(LinearBackend):
    """A linear backend nvfp4stack runs: ``prepare`` once, ``apply`` per call."""

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


def runnable_backend(kind: str, kernel: str, prefix: str, fix: str) -> type[KernelBackend]:
    """The registered ``kind`` backend ``kernel``, which must be one nvfp4stack runs (prepare/apply);
    else a refusal naming the layer, the vLLM flag that runs it and the ones nvfp4stack runs."""
    runnable = {"moe": RunnableMoeBackend, "linear": RunnableLinearBackend}[kind]
    reg = registry_for(kind)
    backend = reg.get(kernel)
    if not issubclass(backend, runnable):
        label = {"moe": "MoE", "linear": "linear"}[kind]
        ours = [n for n in reg.names() if issubclass(reg.get(n), runnable)]
        raise ValueError(f"{prefix}: {label} backend {kernel!r} is run by vLLM (--{kind}-backend "
                         f"{backend.capabilities.vllm_flag}), not by nvfp4stack's {label} method; expected one of "
                         f"{', '.join(ours)}. Fix: {fix}")
    return backend


def load_backends() -> None:
    """Import every backend module, which registers it; none imports anything heavy at module level."""
    import nvfp4stack.kernels.linear  # noqa: F401
    import nvfp4stack.kernels.moe  # noqa: F401


def backends_with(kind: str, has: Callable[[Capabilities], bool]) -> list[str]:
    """The registered ``kind`` backends whose capabilities satisfy ``has``, by name (sorted)."""
    load_backends()
    reg = registry_for(kind)
    return [n for n in reg.names() if has(reg.get(n).capabilities)]
