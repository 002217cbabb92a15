"""nvfp4stack/engine/tilelang_compile.py: a warm-up's TileLang kernels compiled on a thread pool.

TileLang needs a CUDA host (its wheel is in the DeepSeek-V4 bundle, not in CI); here a stand-in with the
shape of TileLang 0.1.9's ``JITImpl`` (``__call__``: key from ``func.parse_args``, its own cache, else
``self.compile``, then the kernel runs) checks the rounds, the deduplication, the pool and the failure
paths. The real kernels run in tests/models/test_dsv4_mhc_warmup.py on a vLLM 0.26 GPU host."""
from __future__ import annotations

import logging
import threading
import time
import types

import pytest

from nvfp4stack.engine import tilelang_compile as tc


class _Func:
    def parse_args(self, *args, **kwargs):   # TileLang keys a call by its non-tensor arguments
        return (args[1:], tuple(sorted(kwargs.items()))), args[:1]


class FakeJIT:
    """TileLang 0.1.9's JITImpl as far as the module uses it."""

    out_idx = execution_backend = target = target_host = verbose = compile_flags = None
    pass_configs = {"k": 1}

    def __init__(self, name: str, tilelang_cache: dict, log: list):
        self.name, self.func, self._kernel_cache = name, _Func(), {}
        self.tilelang_cache, self.log = tilelang_cache, log

    def get_tir(self, *args, **kwargs):
        return (self.name, self.func.parse_args(*args, **kwargs)[0])

    def par_compile(self, configs, num_workers=None, ignore_error=False):   # only looked for
        raise AssertionError("not called")

    def compile(self, *args, **kwargs):   # the real one: TileLang's kernel cache, else a (slow) compile
        tir = self.get_tir(*args, **kwargs)
        if tir not in self.tilelang_cache:
            self.log.append(("call-compile", tir))
            self.tilelang_cache[tir] = f"kernel{tir}"
        return self.tilelang_cache[tir]

    def __call__(self, *args, **kwargs):
        key, tensors = self.func.parse_args(*args, **kwargs)
        kernel = self._kernel_cache.get(key)
        if kernel is None:
            kernel = self.compile(*args, **kwargs)
            self._kernel_cache[key] = kernel
        self.log.append(("run", self.name, key))
        return kernel


def _pool_compile(tilelang_cache: dict, log: list, fail=(), delay: float = 0.0):
    active, peak, lock = [0], [0], threading.Lock()

    def compile_tir(tir, **settings):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            assert settings["pass_configs"] == {"k": 1} and "out_idx" in settings and "compile_flags" in settings
            time.sleep(delay)
            if tir in fail:
                raise RuntimeError(f"nvcc failed on {tir}")
            with lock:
                log.append(("pool-compile", tir))
                tilelang_cache[tir] = f"kernel{tir}"
        finally:
            with lock:
                active[0] -= 1
        return tilelang_cache[tir]

    return compile_tir, peak


def _chain(a: FakeJIT, b: FakeJIT):
    """A function calling two kernels in turn, specialized on the token count's bucket, like vLLM's mHC."""
    def fused(n: int):
        split = max(1, 8 // n)
        return a("x", split), b("y", split, hc=4)
    return fused


def test_every_specialization_is_compiled_once_on_the_pool_and_the_last_round_is_the_warmup():
    cache, log = {}, []
    a, b = FakeJIT("a", cache, log), FakeJIT("b", cache, log)
    fused = _chain(a, b)
    sizes = [1, 2, 3, 4, 8, 16]   # splits 8, 4, 2, 2, 1, 1: four specializations a kernel
    compile_tir, peak = _pool_compile(cache, log, delay=0.05)
    n = tc.compile_ahead([a, b], [lambda n=n: fused(n) for n in sizes], workers=4, compile_tir=compile_tir)
    assert n == 8
    pooled = [e[1] for e in log if e[0] == "pool-compile"]
    assert sorted(pooled) == sorted({("a", ((s,), ())) for s in (8, 4, 2, 1)}
                                    | {("b", ((s,), (("hc", 4),))) for s in (8, 4, 2, 1)})
    assert not [e for e in log if e[0] == "call-compile"]   # nothing compiled at a call
    assert peak[0] > 1                                      # the pool ran compiles at once
    # round 1 compiles a's (b is never reached: the chain stops at a), round 2 b's, round 3 runs the warm-up
    runs = [e for e in log if e[0] == "run"]
    assert [r[1] for r in runs[-12:]] == ["a", "b"] * 6
    assert "compile" not in vars(a) and "compile" not in vars(b)   # the recorders are gone
    assert len(a._kernel_cache) == len(b._kernel_cache) == 4


def test_a_step_can_go_on_past_a_deferred_call_to_record_the_next_kernel_in_the_same_round():
    cache, log = {}, []
    a, b = FakeJIT("a", cache, log), FakeJIT("b", cache, log)
    rounds = []
    compile_tir, _ = _pool_compile(cache, log)

    def counting(tir, **s):
        rounds.append(tir)
        return compile_tir(tir, **s)

    def step():
        try:
            a("x", 1)
        except tc.Deferred:
            pass
        b("y", 1)

    assert tc.compile_ahead([a, b], [step], workers=2, compile_tir=counting) == 2
    assert len(rounds) == 2 and not [e for e in log if e[0] == "call-compile"]


def test_a_compile_that_fails_on_the_pool_is_left_to_the_kernels_own_call():
    cache, log = {}, []
    a = FakeJIT("a", cache, log)
    bad = ("a", ((2,), ()))
    compile_tir, _ = _pool_compile(cache, log, fail={bad})
    assert tc.compile_ahead([a], [lambda s=s: a("x", s) for s in (1, 2)], workers=2, compile_tir=compile_tir) == 1
    assert [e[1] for e in log if e[0] == "call-compile"] == [bad]   # compiled where it would have been
    assert ("run", "a", ((2,), ())) in log


def test_an_error_in_a_step_is_the_steps_own_and_the_recorders_are_removed():
    cache, log = {}, []
    a = FakeJIT("a", cache, log)
    compile_tir, _ = _pool_compile(cache, log)

    def step():
        a("x", 1)
        raise ValueError("bad shape")

    with pytest.raises(ValueError, match="bad shape"):
        tc.compile_ahead([a], [step], compile_tir=compile_tir)
    assert "compile" not in vars(a)


def test_no_kernels_means_plain_calls_and_no_tilelang():
    seen = []
    assert tc.compile_ahead([], [lambda: seen.append(1), lambda: seen.append(2)]) == 0
    assert seen == [1, 2]


def test_rounds_are_bounded_then_the_steps_run_as_plain_calls():
    """A chain longer than max_rounds: each round compiles one link on the pool, the rest compile at their calls."""
    cache, log = {}, []
    chain = [FakeJIT(n, cache, log) for n in "abcd"]
    compile_tir, _ = _pool_compile(cache, log)
    ran = []

    def step():
        ran.append([k("x", 1) for k in chain])

    assert tc.compile_ahead(chain, [step], max_rounds=2, compile_tir=compile_tir) == 2
    assert [e[1][0] for e in log if e[0] == "pool-compile"] == ["a", "b"]
    assert [e[1][0] for e in log if e[0] == "call-compile"] == ["c", "d"]
    assert len(ran[-1]) == 4 and all("compile" not in vars(k) for k in chain)


def test_a_call_the_kernel_cannot_key_compiles_at_the_call():
    cache, log = {}, []

    class Unkeyed(FakeJIT):   # no usable parse_args: nothing to deduplicate or cache by
        def __init__(self, *a):
            super().__init__(*a)
            self.func = types.SimpleNamespace(parse_args=None)

        def __call__(self, *args, **kwargs):
            return self.compile(*args, **kwargs)

    a = Unkeyed("a", cache, log)
    a.get_tir = lambda *args, **kw: ("a", args)
    compile_tir, _ = _pool_compile(cache, log)
    assert tc.compile_ahead([a], [lambda: a("x", 1)], compile_tir=compile_tir) == 0
    assert [e[0] for e in log] == ["call-compile"]


def test_an_existing_compile_attribute_is_put_back():
    cache, log = {}, []
    a = FakeJIT("a", cache, log)
    mine = a.compile
    a.compile = mine   # an instance attribute set before the warm-up
    compile_tir, _ = _pool_compile(cache, log)
    tc.compile_ahead([a], [lambda: a("x", 1)], compile_tir=compile_tir)
    assert vars(a)["compile"] is mine


def test_jit_kernels_finds_the_modules_tilelang_kernels():
    cache, log = {}, []
    mod = types.SimpleNamespace(k1=FakeJIT("a", cache, log), helper=len, value=3, k2=FakeJIT("b", cache, log))
    assert [k.name for k in tc.jit_kernels(mod)] == ["a", "b"]


def test_workers_default_and_env(monkeypatch, caplog):
    monkeypatch.delenv(tc.ENV_WORKERS, raising=False)
    assert 1 <= tc.default_workers() <= 16
    monkeypatch.setenv(tc.ENV_WORKERS, "3")
    assert tc.default_workers() == 3
    monkeypatch.setenv(tc.ENV_WORKERS, "zero")   # a warning and the default: never the warm-up lost
    with caplog.at_level(logging.WARNING, logger="vllm.nvfp4stack"):
        assert 1 <= tc.default_workers() <= 16
    assert tc.ENV_WORKERS + "='zero': expected a whole number" in caplog.text
