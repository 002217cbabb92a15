"""Fused NVFP4 weight-only expert MLP in Triton (sm80 to sm120): the ``triton_w4a16`` backend's kernel.

Two launches over expert-aligned token blocks (routing.py):
  L1  x[T,H] @ w13[e]^T -> clamped SwiGLU (swiglu_limit) -> h[slots, I]   (bf16, sorted-slot order)
  L2  h @ w2[e]^T * routing weight -> rows[T*k, H]; top-k rows summed per token.
Weights stay packed; tiles are dequantized in registers. Triton is imported only when the
kernel runs, so CPU hosts can import this module (tile heuristics, tests, benchmarks).
Decode loads (<= 64 routed rows per expert) on sm90 run Gluon kernels instead: below 0.5 rows those of
_decode_gluon.py (weights as the mma.sync M side, operands built in registers, no shared memory),
from 0.5 rows the wgmma kernels of _decode_wgmma.py (weights, scales and token tiles through one
cp.async ring; over 5 rows busy experts in bigger token blocks of their own launches, on a side
stream); routing alignment is one Triton launch (routing_triton.py) up to 49,152 slots. One token on the
mma.sync tiles (``one_token_path``) launches L1 and L2 only: each slot its own routing block, no alignment
(routing.one_token_routing), and the top-k sum done by L2's last run of each output tile.
Prefill-heavy calls can instead run the FP8 tensor-core mode (fp8_prefill.py, ``mode``/``fp8_weights``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
from nvfp4stack.kernels.moe.hopper_w4a16.routing_triton import (
    align_routing,
    align_routing_split,
    one_token_routing_cached,
)
from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import (  # noqa: F401  (the tile choice, re-exported)
    CANDIDATES,
    DECODE_CANDIDATES,
    DECODE_MAX_ROWS_PER_EXPERT,
    DIAG,
    DecodeConfig,
    TileConfig,
    decode_available,
    decode_pair,
    fill_split,
    pick_call,
    pick_config,
    pick_decode,
    pick_tiles,
)
from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import check_moe_args

if TYPE_CHECKING:
    from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
    from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import Fp8ExpertWeights


def global_scale_per_expert(t: "Nvfp4Tensor", num_experts: int, name: str) -> torch.Tensor:
    """A stacked NVFP4 weight's global scale as fp32 [E] (one shared value broadcast), checked."""
    gs = t.global_scale.to(torch.float32).reshape(-1)
    if gs.numel() == 1:
        gs = gs.expand(num_experts)
    if gs.numel() != num_experts:
        raise ValueError(
            f"{name}.global_scale: expected 1 or {num_experts} values (one per expert), "
            f"found {gs.numel()}; quantize the stacked [E, N, K] weight with quantize_nvfp4"
        )
    return gs.contiguous()


def routed_rows_per_expert(tokens: int, top_k: int, num_experts: int, routed_experts: int = 0) -> float:
    """The average routed rows per expert a call's tiles and mode are picked for: tokens x top-k over
    ``routed_experts`` when it exceeds these ``num_experts`` (expert parallelism: the router chose among
    all ranks' experts, and with vLLM's all-gather dispatch this rank sees every token; at EP 8 the
    count over the local experts alone would be 8x too many), else over ``num_experts``."""
    if routed_experts and routed_experts < num_experts:
        raise ValueError(f"routed_experts: expected 0 or at least the {num_experts} local experts, found "
                         f"{routed_experts}; pass the router's expert count (the length of vLLM's expert_map)")
    return tokens * top_k / max(routed_experts, num_experts)


def nvfp4_moe_forward_triton(
    x: torch.Tensor,
    w13: "Nvfp4Tensor",
    w2: "Nvfp4Tensor",
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
    a13_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
    activation: str = "silu",
    config: tuple[TileConfig, TileConfig] | tuple[DecodeConfig, DecodeConfig] | None = None,
    poison: bool = False,
    mode: str = "auto",
    fp8_weights: "Fp8ExpertWeights | None" = None,
    tiled: bool = False,
    routed_experts: int = 0,
) -> torch.Tensor:
    """Same function as torch_twin.nvfp4_moe_forward with bf16 activations; a negative expert id
    (another rank's expert under expert parallelism) contributes nothing.

    a13_scale / a2_scale are accepted and ignored: this path is weight-only, activations stay bf16.
    ``config`` overrides the (L1, L2) tile heuristic (benchmark sweeps): TileConfig pairs run
    the Triton kernels, DecodeConfig pairs the Gluon decode kernels. ``poison`` fills the
    scratch buffers with NaN first, so a test sees any element the kernels failed to write.
    ``mode``: 'w4a16', 'fp8' (FP8 tensor-core prefill on ``fp8_weights``, built once at load by
    fp8_prefill.prepare_fp8_experts) or 'auto' (fp8 from FP8_MIN_ROWS_PER_EXPERT routed rows per
    expert when ``fp8_weights`` is given, else w4a16).
    ``tiled``: w13/w2 hold their bytes in tiles.py's tile-contiguous layout (tiles.tile_experts; what
    the backend prepares on sm90), not the checkpoint's row-major one. Scales stay row-major.
    ``routed_experts``: the experts the router chooses among when more than these (all ranks' under
    expert parallelism: most slots then arrive as -1), 0 for these; the tiles and the mode are
    picked for tokens x top-k / that many rows per expert (routed_rows_per_expert).
    """
    from nvfp4stack.kernels.moe.hopper_w4a16 import fp8_prefill

    num_experts, inter, hidden = check_moe_args(x, w13, w2, topk_weights, topk_ids, activation)
    if x.device.type != "cuda":
        raise ValueError(
            f"triton_w4a16: x is on {x.device}, expected a CUDA tensor; "
            "use backend.moe=torch_emulation on CPU"
        )
    if tiled:
        tiles.check_fits(w13.data, "w13")
        tiles.check_fits(w2.data, "w2")
        if config is not None and any(c.deq == 1 for c in config):
            raise ValueError(f"triton_w4a16: config {config} dequantizes per element (deq=1), which reads "
                             "row-major bytes only, and the weights are tiled; pass row-major weights "
                             "(tiled=False) or a deq=2 tile")
    tokens, top_k = topk_ids.shape
    out_dtype = x.dtype
    xb = x.to(torch.bfloat16).contiguous()
    if tokens == 0:
        return torch.zeros_like(x)
    rows_per_expert = routed_rows_per_expert(tokens, top_k, num_experts, routed_experts)
    if fp8_prefill.select_mode(mode, rows_per_expert, fp8_weights) == "fp8":
        fp8_prefill.check_fp8_matches(fp8_weights, w13, w2)
        return fp8_prefill.fp8_moe_forward(
            xb, fp8_weights, topk_weights, topk_ids, swiglu_limit=swiglu_limit, poison=poison
        ).to(out_dtype)

    cfg1, cfg2 = config or pick_call(rows_per_expert, tokens * top_k, num_experts, hidden, inter,
                                     decode_available(x.device), sm_count(x.device))
    if cfg1.block_m != cfg2.block_m or type(cfg1) is not type(cfg2):
        raise ValueError(f"config: L1 and L2 share the routing blocks, found {cfg1} and {cfg2}")
    decode = isinstance(cfg1, DecodeConfig)
    if decode and bool(cfg1.wgmma) != bool(cfg2.wgmma):
        raise ValueError(f"config: wgmma and mma.sync decode tiles do not pair (the wgmma L1 writes h K-permuted for "
                         f"a wgmma L2), found {cfg1} and {cfg2}")
    if decode and not (cfg1.fits(hidden, inter) and cfg2.fits(hidden, inter)):
        raise ValueError(f"config: decode tiles {cfg1} / {cfg2} do not divide hidden {hidden}, inter {inter}")
    if decode and cfg1.big_t != cfg2.big_t:
        raise ValueError(f"config: L1 and L2 share the routing blocks, so also big_t, found {cfg1} and {cfg2}")
    # one Triton launch instead of ~20 torch kernels where the slot count is decode-sized; none for one token
    one = one_token_routing_cached(topk_ids, cfg1.block_m) if one_token_path(tokens, cfg1) else None
    if one is not None:
        parts = [(one, cfg1, cfg2)]
    elif decode and cfg1.big_t:  # two routings, each run on its own launches of the same kernels
        small, big = align_routing_split(topk_ids, num_experts, cfg1.block_t, cfg1.big_t)
        parts = [(small, cfg1, cfg2), (big, replace(cfg1, block_t=cfg1.big_t, big_t=0),
                                       replace(cfg2, block_t=cfg2.big_t, big_t=0))]
    else:
        parts = [(align_routing(topk_ids, num_experts, cfg1.block_m), cfg1, cfg2)]
    w13_data, w13_scale = w13.data.contiguous(), w13.scale.contiguous().view(torch.uint8)
    w2_data, w2_scale = w2.data.contiguous(), w2.scale.contiguous().view(torch.uint8)
    gs13 = global_scale_per_expert(w13, num_experts, "w13")
    gs2 = global_scale_per_expert(w2, num_experts, "w2")

    scratch = torch.full if poison else (lambda size, _fill, **kw: torch.empty(size, **kw))
    inter_all = scratch((sum(r.sorted_ids.numel() for r, _, _ in parts), inter), float("nan"), dtype=torch.bfloat16,
                        device=x.device)
    # the top-k rows: bf16 [1, slots, hidden], or (L2 split_k > 1, mma.sync decode tiles) L2's fp32 partials
    # [runs, slots, hidden], which the top-k sum adds
    split2 = getattr(cfg2, "split_k", 1)
    rows_all = scratch((split2, tokens * top_k, hidden), float("nan"),
                       dtype=torch.float32 if split2 > 1 else torch.bfloat16, device=x.device)
    rows = rows_all[0]
    route_w = topk_weights.to(torch.float32).reshape(-1).contiguous()
    limit = float(swiglu_limit) if swiglu_limit is not None else 0.0
    has_limit = swiglu_limit is not None
    x_in = xb
    if decode and cfg1.wgmma:
        # cp.async stages the activations verbatim: x goes in the weights' K order (one launch), and L1
        # writes h in L2's
        x_in = _permute_k(xb, cfg1.block_k)
    launches = []
    row0 = 0
    for routing, c1, c2 in parts:
        inter_buf = inter_all[row0:row0 + routing.sorted_ids.numel()]
        row0 += routing.sorted_ids.numel()
        # operands shared by the Triton and the Gluon kernels (these take max_blocks / limit after them)
        ids = (routing.sorted_ids, routing.expert_ids, routing.num_padded, routing.num_slots)
        l1_args = (x_in, x_in.stride(0), *_weight_args(w13_data, w13_scale, gs13), inter_buf, inter_buf.stride(0),
                   *ids, top_k, inter, hidden)
        l2_args = (inter_buf, inter_buf.stride(0), *_weight_args(w2_data, w2_scale, gs2), route_w, rows,
                   rows.stride(0), *ids, hidden, inter)
        launches.append((c1, c2, l1_args, l2_args, routing.grid_blocks, inter, hidden, limit, has_limit, tiled,
                         rows_all.stride(0)))
    if one is not None:  # L2 sums the top-k rows into the output itself
        out = torch.empty((1, hidden), dtype=out_dtype, device=x.device)
        _launch_gemms(*launches[0], fused_sum=(out, top_k))
        return out
    if len(launches) == 2 and SPLIT_STREAMS:
        # the two routings share nothing but x and disjoint rows of h / the top-k rows: the busy experts'
        # launches run on a side stream, next to the small experts' (forked from and joined to the
        # caller's stream, so CUDA-graph capture records two branches)
        main, side = torch.cuda.current_stream(x.device), _side_stream(x.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            _launch_gemms(*launches[1])
        _launch_gemms(*launches[0])
        main.wait_stream(side)
    else:
        for args in launches:
            _launch_gemms(*args)
    return _topk_sum(rows_all, topk_ids, hidden, out_dtype, pdl=len(launches) == 1 and pdl_path(cfg1))


# the wgmma kernels' K-permuted copy of x in one Triton launch (False: torch's strided copy, k_order.permute_k;
# the A/B of bench/tools/permute_k_ab.py)
PERMUTE_TRITON = True


def _permute_k(xb: torch.Tensor, block_k: int) -> torch.Tensor:
    if PERMUTE_TRITON:
        from nvfp4stack.kernels.moe.hopper_w4a16.k_order_triton import permute_k_triton

        return permute_k_triton(xb, block_k)
    from nvfp4stack.kernels.moe.hopper_w4a16.k_order import permute_k

    return permute_k(xb, block_k)


# one token on the mma.sync decode tiles: no routing launch, the top-k sum inside L2 (False: as for more tokens;
# the A/B of bench/tools/one_token_ab.py)
ONE_TOKEN = True


# programmatic dependent launch between the mma.sync decode kernels (L1 -> L2 -> top-k sum; sm90 only, as they are):
# L2's programs start in L1's tail and load their first weights before waiting for h (False: plain launches;
# the A/B of bench/tools/one_token_ab.py --flag pdl)
PDL = True


def pdl_path(cfg1) -> bool:
    """Whether a call on L1 tiles ``cfg1`` chains its launches by PDL (the mma.sync decode pair, switch on)."""
    return PDL and isinstance(cfg1, DecodeConfig) and not cfg1.wgmma


def one_token_path(tokens: int, cfg1) -> bool:
    """Whether a call of ``tokens`` tokens on L1 tiles ``cfg1`` runs one_token_routing and L2's top-k sum (the
    forward's choice; a warm-up launch key of its own: its L2 binary differs)."""
    return ONE_TOKEN and tokens == 1 and isinstance(cfg1, DecodeConfig) and not cfg1.wgmma and not cfg1.big_t


def sm_count(device: torch.device) -> int:
    """The device's SM count (fill_split's), cached: a property query per call costs host time at decode."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


_SMS: dict = {}


# split decode (DecodeConfig.big_t): the busy experts' launches on a side stream (False: after the small ones)
SPLIT_STREAMS = True
_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def _launch_gemms(cfg1, cfg2, l1_args: tuple, l2_args: tuple, nblocks: int, inter: int, hidden: int, limit: float,
                  has_limit: bool, tiled: bool, rows_split_stride: int, fused_sum=None) -> None:
    """L1 then L2 over ``nblocks`` routing blocks, on the kernels the (L1, L2) tiles name (``rows_split_stride``:
    the top-k rows' partials' first-dim stride, for mma.sync decode tiles whose L2 has split_k > 1; ``fused_sum``:
    (out, top_k) for the one-token path, mma.sync decode tiles only)."""
    if isinstance(cfg1, DecodeConfig):
        if cfg1.wgmma:
            from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_wgmma as kernels

            kernels.launch(cfg1, cfg2, l1_args, l2_args, nblocks, inter, hidden, limit, has_limit, tiled)
        else:
            from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as kernels

            kernels.launch(cfg1, cfg2, l1_args, l2_args, nblocks, inter, hidden, limit, has_limit, tiled, rows_split_stride,
                           fused_sum, pdl=pdl_path(cfg1))
        return
    from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import l1_swiglu_kernel, l2_combine_kernel

    grid1 = (nblocks * triton_cdiv(inter, cfg1.block_n),)
    l1_swiglu_kernel[grid1](*l1_args, nblocks, limit, HAS_LIMIT=has_limit, TILED=tiled, **cfg1.launch_args(hidden))
    grid2 = (nblocks * triton_cdiv(hidden, cfg2.block_n),)
    l2_combine_kernel[grid2](*l2_args, nblocks, TILED=tiled, **cfg2.launch_args(inter))


def _weight_args(data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> tuple:
    """Packed [E, N, K/2] weights and [E, N, K/16] scales with their expert and row strides."""
    return (data, data.stride(0), data.stride(1), scale, scale.stride(0), scale.stride(1), global_scale)


def _topk_sum(rows: torch.Tensor, topk_ids: torch.Tensor, hidden: int, out_dtype, pdl: bool = False) -> torch.Tensor:
    """Top-k combine in fp32 (like vLLM's moe_sum) of ``rows`` [runs, tokens * top_k, hidden] (more than one
    run: L2's split_k partials, summed too), one launch; slots of negative ids skipped. ``pdl``: right after
    the Gluon decode L2 (which lets it launch early), by programmatic dependent launch."""
    from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import topk_sum_kernel

    tokens, top_k = topk_ids.shape
    out = torch.empty((tokens, hidden), dtype=out_dtype, device=rows.device)
    block = 1024
    topk_sum_kernel[(tokens, triton_cdiv(hidden, block))](rows, topk_ids.contiguous(), out, hidden, rows.stride(0),
                                                          TOP_K=top_k, SPLIT=rows.shape[0], BLOCK=block, num_warps=4,
                                                          PDL=pdl, launch_pdl=pdl)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
