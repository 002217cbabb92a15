"""The ``vllm.general_plugins`` entry point: vLLM calls ``register()`` once in every process.

Everything nvfp4stack adds to vLLM is registered here (API server, engine core, each worker), so
nothing depends on a monkey-patch reaching another process. Module import is free of vLLM and
torch: vLLM-less installs (planning, converting) can import it safely.
"""
from __future__ import annotations

import logging

log = logging.getLogger("nvfp4stack.engine")
_registered = False


def register() -> bool:
    """Register the ``nvfp4stack`` quantization config, the ``synthetic`` load format, the CPU NVFP4
    linear kernel (CPU), and what each model family adds (``ModelFamily.register_vllm``).

    Idempotent (vLLM may call plugins more than once per process). Returns True when vLLM is
    present and everything was registered, False when vLLM is not installed.
    """
    global _registered
    if _registered:
        return True
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False

    from vllm.model_executor.layers.quantization import register_quantization_config

    from nvfp4stack.engine.plan_section import QUANT_METHOD
    from nvfp4stack.engine.quant_config import Nvfp4StackConfig

    register_quantization_config(QUANT_METHOD)(Nvfp4StackConfig)
    from nvfp4stack.engine.synthetic_loader import register as register_synthetic_loader

    register_synthetic_loader()   # engine.load_format=synthetic: weights drawn at load, no checkpoint
    from vllm.platforms import current_platform

    if current_platform.is_cpu():  # GPUs have vLLM's own NVFP4 linear kernels
        _register_cpu_nvfp4_linear()
    from nvfp4stack.families.registry import families

    platform = "cpu" if current_platform.is_cpu() else "cuda" if current_platform.is_cuda() else "other"
    if platform == "cuda":   # DeepGEMM's warm-up over processes (NVFP4STACK_DEEPGEMM_WARMUP_PROCS=0: off)
        try:
            from nvfp4stack.engine.deepgemm_warmup import install as install_deepgemm_warmup

            install_deepgemm_warmup()
        except Exception as e:
            log.warning("nvfp4stack: the DeepGEMM warm-up was not installed (%s: %s)", type(e).__name__, e)
    for family in families():   # e.g. a family's kernel warm-up on CUDA; vLLM does not catch a plugin's errors
        try:
            family.register_vllm(platform)
        except Exception as e:
            log.warning("nvfp4stack: family %s: its vLLM additions were not registered (%s: %s)",
                        family.name, type(e).__name__, e)
    _registered = True
    log.info("nvfp4stack: registered vLLM quantization config %r", QUANT_METHOD)
    return True


def _register_cpu_nvfp4_linear() -> None:
    """Let vLLM's own NVFP4 emulation linear kernel run on CPU (vLLM lists none for CPU).

    This is vLLM's kernel chosen through vLLM's kernel registry, not a re-implementation; it is
    what ``backend.linear=vllm_emulation`` means on a CPU host.
    """
    from vllm.model_executor.kernels.linear import _POSSIBLE_NVFP4_KERNELS, register_linear_kernel
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms import PlatformEnum

    if EmulationNvFp4LinearKernel not in _POSSIBLE_NVFP4_KERNELS.get(PlatformEnum.CPU, []):
        register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")
