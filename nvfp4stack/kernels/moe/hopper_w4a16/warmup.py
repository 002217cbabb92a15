"""Compile every kernel binary the ``triton_w4a16`` MoE can launch, once, before serving.

Triton compiles a kernel the first time it meets a new tile config (and, for specialized integer
arguments, a new value class). A server meets new token counts mid-request; on an H200 that cost
1.6-2.1 s of TTFT per new binary (bench/RESULTS.md). The per-call sizes are unspecialized in the
kernels (``do_not_specialize``), so the binaries a call needs depend only on which tiles, mode and
routing path it takes: ``launch_key``, computed by the same functions the forward uses.
``warmup_token_counts`` finds the smallest token count of each distinct key up to the engine's
token budget, and ``warm_up`` runs the forward once at each: every binary is then compiled (or
loaded from Triton's disk cache) at model load, where vLLM's own warm-up and profiling happen.
"""
from __future__ import annotations

import logging
import time
from typing import Hashable

import torch

from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
from nvfp4stack.kernels.moe.hopper_w4a16 import fp8_prefill
from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import (
    decode_available,
    nvfp4_moe_forward_triton,
    one_token_path,
    pick_call,
    routed_rows_per_expert,
    sm_count,
)
from nvfp4stack.kernels.moe.hopper_w4a16.routing_triton import routing_path

log = logging.getLogger(__name__)

_WARMED: set[tuple] = set()  # (device, shapes, top_k, budget, limit?, fp8?) already warmed here
_HAS_FP8 = object()  # select_mode only asks whether FP8 weights exist


def launch_key(tokens: int, top_k: int, num_experts: int, hidden: int, inter: int, *,
               decode: bool, has_fp8: bool, routed_experts: int = 0, sm_count: int = 0) -> Hashable:
    """What decides the binaries one forward call of ``tokens`` tokens launches ('auto' mode; ``sm_count``:
    the GPU's SMs, on which the decode tiles' split_k depends, 0 for none)."""
    rows = routed_rows_per_expert(tokens, top_k, num_experts, routed_experts)
    routing = routing_path(tokens * top_k)  # routing_triton.align_routing's choice
    if fp8_prefill.select_mode("auto", rows, _HAS_FP8 if has_fp8 else None) == "fp8":
        return ("fp8", routing)
    tiles = pick_call(rows, tokens * top_k, num_experts, hidden, inter, decode, sm_count)
    if one_token_path(tokens, tiles[0]):  # no routing launch, and an L2 of its own (the fused top-k sum)
        return (tiles, "one token")
    return (tiles, routing)


def warmup_token_counts(top_k: int, num_experts: int, hidden: int, inter: int, max_tokens: int, *,
                        decode: bool, has_fp8: bool, routed_experts: int = 0, sm_count: int = 0) -> list[int]:
    """The smallest token count of every distinct ``launch_key`` in 1..max_tokens."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens: expected the engine's token budget (>= 1), found {max_tokens}")
    first: dict[Hashable, int] = {}
    for t in range(1, max_tokens + 1):
        first.setdefault(launch_key(t, top_k, num_experts, hidden, inter, decode=decode, has_fp8=has_fp8,
                                    routed_experts=routed_experts, sm_count=sm_count), t)
    return sorted(first.values())


def warm_up(w13: Nvfp4Tensor, w2: Nvfp4Tensor, top_k: int, max_tokens: int, *,
            swiglu_limit: float | None, fp8_weights: "fp8_prefill.Fp8ExpertWeights | None" = None,
            tiled: bool = False, routed_experts: int = 0) -> list[int]:
    """Run the forward once per distinct launch key up to ``max_tokens`` on these weights (random
    activations, routing spread over all experts); returns the token counts run ([] when an
    earlier layer of the same shapes already did it in this process). ``routed_experts``: as the
    forward's (expert parallelism), so that the keys are the ones serving meets."""
    device = w13.data.device
    num_experts, two_i, hidden = w13.shape
    inter = two_i // 2
    key = (str(device), tuple(w13.shape), tuple(w2.shape), top_k, max_tokens, swiglu_limit is None,
           fp8_weights is None, tiled, routed_experts)
    if key in _WARMED or device.type != "cuda":
        return []
    counts = warmup_token_counts(top_k, num_experts, hidden, inter, max_tokens,
                                 decode=decode_available(device), has_fp8=fp8_weights is not None,
                                 routed_experts=routed_experts, sm_count=sm_count(device))
    start = time.perf_counter()
    g = torch.Generator(device=device).manual_seed(0)
    for t in counts:
        x = torch.randn(t, hidden, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
        ids = (torch.arange(t * top_k, device=device, dtype=torch.int32) % num_experts).view(t, top_k)
        weights = torch.full((t, top_k), 1.0 / top_k, device=device, dtype=torch.float32)
        nvfp4_moe_forward_triton(x, w13, w2, weights, ids, swiglu_limit=swiglu_limit, mode="auto",
                                 fp8_weights=fp8_weights, tiled=tiled, routed_experts=routed_experts)
    torch.cuda.synchronize(device)
    _WARMED.add(key)
    log.info("triton_w4a16: compiled the MoE kernels for %d launch configurations (token counts %s, "
             "budget %d) in %.1f s", len(counts), counts, max_tokens, time.perf_counter() - start)
    return counts
