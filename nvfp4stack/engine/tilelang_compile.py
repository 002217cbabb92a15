"""A warm-up's TileLang kernels compiled on several threads, not one after another at their first calls.

A ``@tilelang.jit`` kernel compiles at its first call with a new specialization, one after another: a
model family's warm-up that calls them at every shape a step can have (the mHC kernels of
``nvfp4stack.models``: about 38 specializations a rank, 13-14 s each on an H200 host) spends minutes.
``compile_ahead(jits, steps)`` runs the warm-up's steps with those kernels' compiles *recorded*
instead of done (a call that needs one stops there, raising :class:`Deferred`), then compiles what
was recorded on a thread pool, TileLang's own way (``tilelang.jit.par_compile``: elaborated on this
thread, compiled on the pool; its kernel cache is thread-safe), and runs the steps again. A step
whose kernels are all compiled runs as it always does, so the round that records nothing new is
the warm-up itself. A function that calls several kernels in turn takes one round per link of the
chain (each round compiles the next link of every step at once).

Whatever goes wrong here costs only the speed-up: a compile that fails on the pool is left to the
kernel's own call, which compiles (or raises) as it would have without this module.
"""
from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Callable, Iterable

from nvfp4stack.engine.env_settings import cores_per_rank, env_int

# under vLLM's logger: its handlers, in the server log (a worker's INFO is lost elsewhere)
log = logging.getLogger("vllm.nvfp4stack")

ENV_WORKERS = "NVFP4STACK_TILELANG_COMPILE_WORKERS"


class Deferred(Exception):
    """Raised by a kernel call whose compile was recorded for the pool; the call did not run."""


def jit_kernels(module) -> list:
    """The TileLang JIT kernels (``@tilelang.jit`` objects) a module defines, in definition order."""
    return [v for v in vars(module).values()
            if callable(getattr(v, "get_tir", None)) and callable(getattr(v, "par_compile", None))]


def default_workers() -> int:
    """``NVFP4STACK_TILELANG_COMPILE_WORKERS``, else this process's usable cores shared among the host's GPUs
    (``env_settings.cores_per_rank``), 1 to 16 threads."""
    return env_int(ENV_WORKERS, min(16, cores_per_rank()), 1)


class _Unkeyed:
    """A call the kernel's ``func.parse_args`` could not key: never deduplicated, never cached by us."""


def _key(jit, args, kwargs):
    """The key the kernel's own ``__call__`` caches its compiled kernel under (TileLang 0.1.9's
    ``func.parse_args``), with the kernel's identity; a fresh object where that is missing (then
    nothing is deduplicated)."""
    try:
        return id(jit), jit.func.parse_args(*args, **kwargs)[0]
    except Exception:
        return id(jit), _Unkeyed()


def _tilelang_compile():
    from tilelang.jit import compile as compile_tir

    return compile_tir


def _compile_all(records: dict, workers: int, compile_tir) -> tuple[int, int]:
    """Elaborate each recorded call here, compile them on ``workers`` threads, and put each kernel where
    its ``__call__`` looks first (TileLang's per-kernel cache, as a call's own compile would: found in
    TileLang's shared cache instead, a call logs a warning); (compiled, failed)."""
    funcs = []
    for key, (jit, args, kwargs) in records.items():
        try:
            funcs.append((key, jit, jit.get_tir(*args, **kwargs)))
        except Exception as e:   # the kernel's own call elaborates again and reports it
            log.debug("nvfp4stack: TileLang elaboration deferred to the call (%s: %s)", type(e).__name__, e)
    failed = len(records) - len(funcs)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(funcs) or 1)), "nvfp4stack-tl") as pool:
        futures = [pool.submit(compile_tir, tir, out_idx=jit.out_idx, execution_backend=jit.execution_backend,
                               target=jit.target, target_host=jit.target_host, verbose=jit.verbose,
                               pass_configs=jit.pass_configs, compile_flags=jit.compile_flags)
                   for _, jit, tir in funcs]
        for (key, jit, _), f in zip(funcs, futures):
            try:
                kernel = f.result()
            except Exception as e:
                failed += 1
                log.debug("nvfp4stack: TileLang compile deferred to the call (%s: %s)", type(e).__name__, e)
                continue
            cache = getattr(jit, "_kernel_cache", None)
            if isinstance(cache, dict) and not isinstance(key[1], _Unkeyed):
                cache[key[1]] = kernel
    return len(records) - failed, failed


def compile_ahead(jits: Iterable, steps: list[Callable[[], object]], *, workers: int | None = None,
                  max_rounds: int = 6, compile_tir=None) -> int:
    """Run ``steps`` (each a call of the warm-up), their TileLang kernels compiled on a pool first.

    Args:
        jits: the ``@tilelang.jit`` kernels whose compiles go to the pool (``jit_kernels(module)``).
        steps: the warm-up, one callable a step; a step may catch :class:`Deferred` from one kernel call
            to go on to its next (on stand-in inputs) in a recording round.
        workers: threads of the pool (``default_workers()``).
        max_rounds: rounds with recording; past them the steps run once more as plain calls.
        compile_tir: TileLang's ``tilelang.jit.compile`` (a stand-in in tests).
    Returns:
        the number of kernels compiled on the pool.
    """
    jits = list(jits)
    if not jits:
        for step in steps:
            step()
        return 0
    workers = workers or default_workers()
    done: set = set()
    compiled = 0
    for _ in range(max_rounds):
        records: dict = {}

        def recorder(jit):
            real = type(jit).compile

            def compile(*args, **kwargs):
                key = _key(jit, args, kwargs)
                if key in done or isinstance(key[1], _Unkeyed):   # failed on the pool, or a call we cannot
                    return real(jit, *args, **kwargs)            # key: the kernel's own compile, as without us
                records.setdefault(key, (jit, args, kwargs))
                raise Deferred
            return compile

        before = [vars(jit).get("compile") for jit in jits]
        for jit in jits:   # an instance attribute: JITImpl.__call__ calls self.compile
            jit.compile = recorder(jit)
        try:
            for step in steps:
                try:
                    step()
                except Deferred:
                    pass
        finally:
            for jit, attr in zip(jits, before):
                if attr is None:
                    vars(jit).pop("compile", None)
                else:
                    jit.compile = attr
        if not records:
            return compiled
        t0 = time.perf_counter()
        ok, failed = _compile_all(records, workers, compile_tir or _tilelang_compile())
        done.update(records)
        compiled += ok
        left = f" ({failed} left to their first call)" if failed else ""
        log.info("nvfp4stack: %d TileLang kernels compiled on %d threads in %.1f s%s", ok,
                 min(workers, len(records)), time.perf_counter() - t0, left)
    for step in steps:   # chains longer than max_rounds: what is left compiles at its call
        step()
    return compiled
