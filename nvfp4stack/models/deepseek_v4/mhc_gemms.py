"""The mHC warm-up's DeepGEMM kernels compiled in child processes, not one after another in the worker (vLLM 0.26).

vLLM 0.26's mHC functions call DeepGEMM's ``tf32_hc_prenorm_gemm`` before and between their TileLang kernels, and
DeepGEMM compiles one kernel per split count and token-count bucket, in C++ under the GIL: about 36 a rank at
Flash's size, some 100 s of the mHC warm-up even where TileLang's cache was warm (one H200, 2026-11-27: 34 TileLang
kernels in 4.9 s, the warm-up 111 s). Here the warm-up's TileLang rounds run with vLLM's GEMM *recorded*
(``recorded``: the layouts of its tensors and the split count, nothing computed), the recorded calls are made in
``deepgemm_warmup``'s child processes (``compile_in_children``), into DeepGEMM's shared cache, and the warm-up then
runs its steps once more with vLLM's own GEMM, which loads those kernels from disk (or compiles what a child
left, as before). The recorder is in place only inside the ``with`` block. Children are used only where they pay:
enough kernels (``MIN_KERNELS``) and fewer of them in DeepGEMM's cache than needed (a fresh host).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

from nvfp4stack.engine.deepgemm_warmup import (
    child_procs,
    child_timeout,
    deal,
    empty_from_spec,
    run_children,
    tensor_spec,
)

log = logging.getLogger("vllm.nvfp4stack")

ENTRY = "nvfp4stack.models.deepseek_v4.mhc_gemms:run"
NAME = "tf32_hc_prenorm_gemm"
# A child costs about 15 s to start (Python, vLLM, CUDA, DeepGEMM) and a kernel about 2.5 s to compile: at 256
# tokens (4 kernels) the children made the warm-up slower, 38-39 s against 22-27 s one after another (H200,
# 2026-11-27). At a server's 133 token counts (about 36 kernels) they are used.
MIN_KERNELS = 12


@contextlib.contextmanager
def recorded(calls: dict, module=None):
    """Within the block, ``module.tf32_hc_prenorm_gemm`` (vLLM's ``vllm.utils.deep_gemm``, which vLLM's mHC functions
    import at each call) records each call's layout into ``calls`` instead of running; restored on leaving."""
    if module is None:
        import vllm.utils.deep_gemm as module
    real = getattr(module, NAME)

    def record(x, fn, out, sqrsum, num_split):
        item = {"x": tensor_spec(x), "fn": tensor_spec(fn), "out": tensor_spec(out),
                "sqrsum": tensor_spec(sqrsum), "num_split": int(num_split)}
        calls.setdefault(json.dumps(item, sort_keys=True), item)
        return out

    setattr(module, NAME, record)
    try:
        yield calls
    finally:
        setattr(module, NAME, real)


def run(items: list[dict], device: str, gemm=None) -> None:
    """In a child: vLLM's own ``tf32_hc_prenorm_gemm`` at each recorded layout (uninitialized tensors: a compile needs
    the layout, not the values)."""
    if gemm is None:
        from vllm.utils.deep_gemm import tf32_hc_prenorm_gemm as gemm
    for it in items:
        gemm(*(empty_from_spec(it[k], device) for k in ("x", "fn", "out", "sqrsum")), it["num_split"])


def kernel_key(item: dict) -> tuple:
    """The kernel a recorded call needs: DeepGEMM specializes the GEMM by its weight's shape and split count, not by
    the token count (on an H200, 13 calls at 9 token counts up to 256 compiled 4 kernels: the 4 (shape, split) pairs)."""
    return tuple(item["fn"]["shape"]), item["num_split"]


def cached_kernels(cache_dir: str | None = None) -> int:
    """This GEMM's kernels in DeepGEMM's cache (``DG_JIT_CACHE_DIR``, which vLLM sets before DeepGEMM's first use);
    0 where no cache directory is named."""
    root = cache_dir or os.environ.get("DG_JIT_CACHE_DIR")
    cache = Path(root) / "cache" if root else None
    if cache is None or not cache.is_dir():
        return 0
    return sum(NAME.removeprefix("tf32_") in p.name for p in cache.iterdir())


def compile_in_children(calls: dict, device_index: int, procs: int | None = None, runner=run_children,
                        min_kernels: int = MIN_KERNELS, cache_dir: str | None = None) -> tuple[int, int]:
    """One recorded call per kernel (``kernel_key``), dealt to ``procs`` children (default: the DeepGEMM warm-up's
    count) on this GPU; (children finished, failed). (0, 0), the warm-up then compiling one after another as before,
    where children would not pay: under ``min_kernels`` kernels, a cache that already holds as many of this GEMM's
    kernels (a host that compiled them once; vLLM's profile run compiles a few before any warm-up), or children
    turned off (``NVFP4STACK_DEEPGEMM_WARMUP_PROCS=0``)."""
    procs = child_procs() if procs is None else procs
    kernels: dict = {}
    for item in calls.values():
        kernels.setdefault(kernel_key(item), item)
    items = list(kernels.values())
    if len(items) < max(1, min_kernels) or procs < 1 or cached_kernels(cache_dir) >= len(items):
        return 0, 0
    specs = [{"device": device_index, "e8m0": False, "cases": [], "work": {ENTRY: part}}
             for part in deal(items, procs) if part]
    t0 = time.perf_counter()
    ok, failed = runner(specs, child_timeout())
    log.info("nvfp4stack: DeepSeek-V4 mHC: %d DeepGEMM %s kernels in %d processes (%d failed) in %.1f s",
             len(items), NAME, len(specs), failed, time.perf_counter() - t0)
    return ok, failed
