"""DeepSeek-V4's mHC TileLang kernels compiled at start for every token count a step can have (vLLM 0.26).

vLLM 0.26's mHC kernels (``mhc_pre_big_fuse_broadcast_with_norm``, ``mhc_pre_big_fuse_with_norm``) are
compiled per ``n_splits``, which vLLM picks from the step's token count in 64-token buckets
(``compute_num_split(64, k, cdiv(num_tokens, 64))``), so a step of a new size stops every rank for a
TileLang compile (13-14 s each on an H200 host; 13 of them inside one client run on two H200s,
2026-11-27). vLLM 0.26's own ``deepseek_v4_mhc_warmup`` is meant to prevent that, but it looks for
``hc_pre``/``hc_post`` methods that 0.26's CUDA ``DeepseekV4DecoderLayer`` does not have, and warms
nothing. vLLM 0.32 replaced it with a warm-up over the kernels' compile keys.

``install()`` (called by the plugin in every process) wraps the name vLLM 0.26's ``kernel_warmup()``
calls: after vLLM's own (no-op) warm-up, ``warm_every_split`` runs the first decoder layer's mHC ops
the way its ``forward`` does (vLLM's own kernel functions, on the layer's own parameters) at token
counts 1, 2, 4, 8, 16 and every 64-token bucket up to ``max_num_batched_tokens`` (at most to the
bucket past the GPU's SM count, where the split stops changing). A size whose
kernels are compiled costs a launch; each new specialization is compiled once, at start, on a thread
pool (``nvfp4stack.engine.tilelang_compile``; about 38 compiles a rank at Flash's size, 13-14 s each
when one follows another), and TileLang's cache keeps it for the next start. ``NVFP4STACK_MHC_WARMUP=0`` turns it off.
"""
from __future__ import annotations

import logging
import os
import time

from nvfp4stack.engine.kernel_warmup_hook import wrap_step

# under vLLM's logger: its handlers, in the server log (a worker's INFO is lost elsewhere)
log = logging.getLogger("vllm.nvfp4stack")

ENV = "NVFP4STACK_MHC_WARMUP"


def token_counts(max_tokens: int, sms: int | None = None) -> list[int]:
    """1, 2, 4, 8, 16 (the small-token kernels) and the top of every 64-token bucket up to max_tokens.

    With ``sms`` (the GPU's SM count) the buckets stop at ``sms + 1``: past ``sms`` CTAs a bucket's
    split is 1 whatever its size, so larger counts compile nothing new and only cost launches."""
    top = min(max_tokens, 64 * (sms + 1)) if sms else max_tokens
    sizes = {t for t in (1, 2, 4, 8, 16) if t <= top}
    sizes.update(range(64, top + 1, 64))
    if top >= 1:
        sizes.add(top)
    return sorted(sizes)


def first_mhc_layer(model):
    """This rank's first decoder layer (the one whose ``forward`` runs the broadcast mHC pre on the first
    pipeline stage; on a later stage its inputs come from the previous one), or None."""
    for module in model.modules():
        if type(module).__name__ == "DeepseekV4DecoderLayer" and hasattr(module, "hc_attn_fn"):
            return module
    return None


def _deep_gemm_supported() -> bool:
    try:
        from vllm.utils.deep_gemm import is_deep_gemm_supported

        return bool(is_deep_gemm_supported())
    except Exception:
        return False


def warm_every_split(model, max_tokens: int, kernels=None, jits=None, gemms: bool | None = None) -> int:
    """Run layer 0's mHC ops as its ``forward`` does at every token count of ``token_counts``.

    The TileLang kernels they call are compiled on a thread pool first (``engine.tilelang_compile``):
    each round runs every count with the compiles recorded, then compiles the recorded ones at once.

    Args:
        model: vLLM's DeepSeek-V4 model (any module holding its decoder layers).
        max_tokens: the scheduler's max_num_batched_tokens.
        kernels: ``(mhc_pre_broadcast, mhc_fused_post_pre)``; vLLM's own TileLang functions by default.
        jits: the TileLang kernels to compile on the pool; vLLM's mHC kernels by default with vLLM's
            functions, none (each compiles at its call) with stand-in ``kernels``.
        gemms: record DeepGEMM's ``tf32_hc_prenorm_gemm`` calls during the pool's rounds and make them in child
            processes (``mhc_gemms``), then run every step once more; default: with vLLM's functions on a GPU
            DeepGEMM supports.
    Returns:
        the number of token counts run (0 when the model has no such layer).
    """
    import torch

    from nvfp4stack.engine.tilelang_compile import Deferred, compile_ahead

    layer = first_mhc_layer(model)
    if layer is None:
        return 0
    real_kernels = kernels is None
    if kernels is None:
        from vllm.model_executor.kernels.mhc import tilelang_kernels
        from vllm.model_executor.kernels.mhc.tilelang import mhc_fused_post_pre_tilelang, mhc_pre_broadcast_tilelang

        from nvfp4stack.engine.tilelang_compile import jit_kernels

        kernels = (mhc_pre_broadcast_tilelang, mhc_fused_post_pre_tilelang)
        jits = jit_kernels(tilelang_kernels) if jits is None else jits
    pre_broadcast, fused_post_pre = kernels
    device = layer.hc_attn_fn.device
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None
    sizes = token_counts(max_tokens, sms)
    if not sizes:
        return 0
    hc = (layer.rms_norm_eps, layer.hc_eps, layer.hc_eps, layer.hc_post_alpha, layer.hc_sinkhorn_iters)
    m, h = layer.hc_mult, layer.hidden_size
    x_all = torch.zeros(sizes[-1], h, dtype=torch.bfloat16, device=device)
    stand_in: list = []

    def previous_stage(n: int) -> tuple:
        """The previous stage's outputs as zeros of their shapes (made once, when first needed): a later
        pipeline stage's inputs, and the fused kernel's in a round where the broadcast pre was deferred."""
        if not stand_in:
            stand_in.extend((torch.zeros(sizes[-1], m, h, dtype=torch.bfloat16, device=device),
                             torch.zeros(sizes[-1], m, 1, dtype=torch.float32, device=device),
                             torch.zeros(sizes[-1], m, m, dtype=torch.float32, device=device)))
        res_all, post_all, mix_all = stand_in
        return res_all[:n], post_all[:n], mix_all[:n], x_all[:n]

    broadcast = getattr(layer, "hc_attn_fn_broadcast", None)

    def step(n: int) -> None:
        if broadcast is None:
            inputs = previous_stage(n)
        else:
            try:
                inputs = pre_broadcast(
                    x_all[:n], layer.hc_attn_fn, layer.hc_attn_scale, layer.hc_attn_base, *hc,
                    norm_weight=layer.attn_norm.weight.data, norm_eps=layer.attn_norm.variance_epsilon,
                    fn_broadcast=broadcast)
            except Deferred:   # recorded for the pool: the fused kernel's compile is recorded this round too
                inputs = previous_stage(n)
        residual, post_mix, res_mix, x = inputs
        fused_post_pre(x, residual, post_mix, res_mix, layer.hc_ffn_fn, layer.hc_ffn_scale, layer.hc_ffn_base,
                       *hc, n_splits=1, tile_n=1, norm_weight=layer.ffn_norm.weight.data,
                       norm_eps=layer.ffn_norm.variance_epsilon)

    steps = [lambda n=n: step(n) for n in sizes]
    if gemms is None:   # vLLM's kernels on a GPU: DeepGEMM's GEMMs compile in children (mhc_gemms)
        gemms = real_kernels and x_all.is_cuda and _deep_gemm_supported()
    t0 = time.perf_counter()
    with torch.inference_mode():
        if gemms:
            from nvfp4stack.models.deepseek_v4 import mhc_gemms

            calls: dict = {}
            with mhc_gemms.recorded(calls):
                compile_ahead(jits or [], steps)
            try:
                mhc_gemms.compile_in_children(calls, device.index if device.index is not None else 0)
            except Exception as e:   # an optimization: the steps below compile what is missing, as before
                log.warning("nvfp4stack: DeepSeek-V4 mHC: DeepGEMM children stopped (%s: %s); the warm-up compiles "
                            "its GEMMs one after another", type(e).__name__, e)
            for s in steps:   # with vLLM's own GEMM: its kernels load from the cache the children filled
                s()
        else:
            compile_ahead(jits or [], steps)
    if x_all.is_cuda:
        torch.cuda.synchronize(x_all.device)
    log.info("nvfp4stack: DeepSeek-V4 mHC kernels warmed at %d token counts (1 to %d) in %.1f s",
             len(sizes), sizes[-1], time.perf_counter() - t0)
    return len(sizes)


def install() -> bool:
    """Wrap vLLM 0.26's ``kernel_warmup.deepseek_v4_mhc_warmup``; False where there is nothing to wrap
    (another vLLM, no CUDA build) or ``NVFP4STACK_MHC_WARMUP=0``."""
    if os.environ.get(ENV, "1") == "0":
        return False

    def make(vllms):
        def deepseek_v4_mhc_warmup(model, *, max_tokens: int, cudagraph_capture_sizes=None):
            vllms(model, max_tokens=max_tokens, cudagraph_capture_sizes=cudagraph_capture_sizes)
            layer = first_mhc_layer(model)
            if layer is None or layer.hc_attn_fn.device.type != "cuda":
                return
            try:
                warm_every_split(model, max_tokens)
            except Exception as e:   # a warm-up is an optimization: vLLM compiles at first use as before
                log.warning("nvfp4stack: DeepSeek-V4 mHC warm-up stopped (%s: %s); kernels of new token counts "
                            "compile at first use; %s=0 turns the warm-up off", type(e).__name__, e, ENV)

        return deepseek_v4_mhc_warmup

    return wrap_step("deepseek_v4_mhc_warmup", make)
