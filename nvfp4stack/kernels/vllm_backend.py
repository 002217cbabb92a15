"""Backends vLLM ships: declarations of when vLLM's kernel applies and which vLLM flag selects it.

vLLM runs these kernels inside its own FusedMoE / LinearMethod (it prepares the weights in its
``process_weights_after_loading`` and applies them in its ``apply``), so they have no
``prepare``/``apply`` here: only ``capabilities`` and the verdicts drawn from them.
"""
from __future__ import annotations

from nvfp4stack.arch import Arch
from nvfp4stack.kernels.base import KernelBackend, LinearBackend, MoeBackend, Verdict


class VllmBackend(KernelBackend):
    """Data, not code: ``capabilities.archs`` (exact arch names, for arch-specific instructions) or
    ``capabilities.min_capability`` (for portable kernels) and ``arch_needs`` (why), and
    ``activation_fp4`` when the kernel quantizes activations to FP4 (W4A4), which Hopper cannot do."""

    @classmethod
    def supports_arch(cls, arch: Arch) -> Verdict:
        caps = cls.capabilities
        if not arch.is_cuda:
            return False, f"{cls.name} is a CUDA kernel in vLLM; arch {arch} has no CUDA GPU"
        if caps.archs is not None:
            if arch.name in caps.archs:
                return True, f"{arch} is one of {', '.join(caps.archs)}"
            return False, f"{cls.name} needs {' or '.join(caps.archs)} ({caps.arch_needs}); arch is {arch}"
        if caps.min_capability is None:
            raise TypeError(f"{cls.name}: capabilities name neither archs nor min_capability; declare one "
                            "(or override supports_arch)")
        if not arch.at_least(*caps.min_capability):
            cap = "sm%d%d" % caps.min_capability
            return False, f"{cls.name} needs {cap} or newer ({caps.arch_needs}); arch is {arch}"
        return True, f"{arch} >= sm{caps.min_capability[0]}{caps.min_capability[1]}"


class VllmMoeBackend(VllmBackend, MoeBackend):
    """A vLLM MoE kernel; ``capabilities.vllm_flag`` is vLLM's --moe-backend value."""


class VllmLinearBackend(VllmBackend, LinearBackend):
    """A vLLM linear kernel; ``capabilities.vllm_flag`` is vLLM's --linear-backend value."""
