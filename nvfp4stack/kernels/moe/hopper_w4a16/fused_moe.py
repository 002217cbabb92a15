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
stream); routing alignment is one Triton launch (routing_triton.py) up to 8192 slots.
Prefill-heavy calls can instead run the FP8 tensor-core mode (fp8_prefill.py, ``mode``/``fp8_weights``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
from nvfp4stack.kernels.moe.hopper_w4a16.routing_triton import align_routing, align_routing_split
from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import check_moe_args

if TYPE_CHECKING:
    from nvfp4stack.formats.nvfp4 import Nvfp4Tensor
    from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import Fp8ExpertWeights


@dataclass(frozen=True)
class TileConfig:
    """One launch's tile shape; ``block_k`` is capped to divide the reduction dim."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    deq: int = 2  # 2: PTX bit placement, 1: per-element Triton ops (_dequant_tile)

    def fit_k(self, k: int) -> int:
        # K tiles below 64 are not used: on an H200 with Triton 3.6 a 16-wide tile gave wrong
        # results and 32-wide ones crashed the compiler (TritonGPUOptimizeDotOperands).
        bk = self.block_k
        while bk > 64 and k % bk:
            bk //= 2
        if k % bk:
            raise ValueError(
                f"triton_w4a16: reduction dim {k} (hidden or moe_intermediate) must be a multiple "
                "of 64; use the torch_emulation backend for this shape"
            )
        return bk

    def launch_args(self, k: int) -> dict:
        return dict(
            BM=self.block_m, BN=self.block_n, BK=self.fit_k(k), GROUP_M=self.group_m,
            DEQ=self.deq,
            num_warps=self.num_warps, num_stages=self.num_stages,
        )


@dataclass(frozen=True)
class DecodeConfig:
    """Tile of the Gluon decode kernels (_decode_gluon.py): weights as the mma.sync M side.

    ``block_t`` tokens per routing block (the MMA's N: 8, 16 or 32), ``mrep`` 16-row MMA tiles per
    warp, so one program covers ``rows = 16 * num_warps * mrep`` weight rows (L1: rows/2 gate
    and rows/2 up rows) and ``block_k`` of the reduction dim per step.
    """

    block_t: int
    mrep: int
    block_k: int
    num_warps: int = 4
    prefetch: int = 0  # 1: the next K step's weights are loaded before this step's math; 0: not
    # 1: the wgmma kernels (_decode_wgmma.py: token tile staged in shared memory per CTA, chunks of
    # chunk_k columns, weights prefetched ``prefetch`` K steps ahead), 2: the same with each step's
    # wgmma left in flight while the next step dequantizes; 3: weights and token tiles through one
    # cp.async ring, ``prefetch`` K steps in flight; 0: the mma.sync kernels (_decode_gluon.py)
    wgmma: int = 0
    chunk_k: int = 512
    # ring tiles (wgmma 3) only: experts with more than block_t routed rows run in blocks of big_t tokens,
    # the same tile otherwise, in launches of their own (routing.align_split); 0: every expert in block_t blocks
    big_t: int = 0

    @property
    def rows(self) -> int:
        return 16 * self.num_warps * self.mrep

    @property
    def block_m(self) -> int:  # routing block, as TileConfig.block_m
        return self.block_t

    deq = 2  # PTX dequant (bench labels)

    def fits(self, hidden: int, inter: int) -> bool:
        return (hidden % self.block_k == 0 and inter % self.block_k == 0
                and inter % (self.rows // 2) == 0 and hidden % self.rows == 0
                and (self.wgmma not in (1, 2) or (self.chunk_steps(hidden) > 0 and self.chunk_steps(inter) > 0))
                and (not self.ring_slots or (hidden // self.block_k % self.ring_slots == 0
                                             and inter // self.block_k % self.ring_slots == 0)))

    @property
    def ring_slots(self) -> int:
        """Slots of the cp.async ring (wgmma 3; the K steps must be a multiple), 0 for the other kernels."""
        return self.prefetch + 1 if self.wgmma == 3 else 0

    def chunk_steps(self, k: int) -> int:
        """wgmma kernels: K steps per staged chunk for reduction dim ``k`` (the largest up to
        chunk_k / block_k that makes the steps an even number of chunks), 0 where none does."""
        steps = k // self.block_k
        return next((c for c in range(max(1, self.chunk_k // self.block_k), 0, -1) if steps % (2 * c) == 0), 0)

    def __post_init__(self):
        if self.prefetch not in ((1, 2, 3, 7) if self.wgmma else (0, 1)) or self.block_t not in (8, 16, 32) or self.block_k % 64:
            raise ValueError(f"DecodeConfig: prefetch 0|1 (wgmma tiles: 1, 2, 3 or 7 K steps ahead), block_t "
                             f"8|16|32, block_k a multiple of 64; got {self}")
        if self.wgmma not in (0, 1, 2, 3) or (self.wgmma and self.num_warps % 4):
            raise ValueError(f"DecodeConfig: wgmma 0-3, and wgmma tiles take whole warpgroups (num_warps 4, 8, 12, "
                             f"16); got {self}")
        if self.big_t and (self.wgmma != 3 or self.big_t not in (16, 32) or self.big_t <= self.block_t):
            raise ValueError(f"DecodeConfig: big_t (the busy experts' token block) is 0, or 16 or 32 tokens over "
                             f"block_t on a ring tile (wgmma 3); got {self}")
        round_bytes = self.ring_slots * self.block_k // 16
        if self.wgmma == 3 and (round_bytes % 16 or (round_bytes // 16) & (round_bytes // 16 - 1)):
            raise ValueError(f"DecodeConfig: the ring (wgmma 3) copies each row's scales of one round of "
                             f"prefetch + 1 K steps in 16-byte pieces, so (prefetch + 1) * block_k / 256 must be a "
                             f"power of two (prefetch 1, 3 or 7 at block_k 128); got {self}")


# Tile heuristics by average routed rows per expert. Decode is bound by weight bytes and by the
# ALU work of dequantizing them: smallest legal M tile. Prefill is MMA bound: large M tiles so
# each dequantized weight tile feeds more rows. Figures behind the choice: bench/moe_kernel_notes.md.
_DECODE = TileConfig(block_m=16, block_n=64, block_k=256, num_warps=4, num_stages=3)
_SMALL = TileConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=4)
_MEDIUM = TileConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4)
_PREFILL = TileConfig(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=3)


def pick_config(rows_per_expert: float) -> tuple[TileConfig, TileConfig]:
    """Heuristic (L1, L2) tile choice from the average routed rows per expert."""
    if rows_per_expert <= 16:
        return _DECODE, _DECODE
    if rows_per_expert <= 32:  # one 32-row block per expert; from 33 one 64-row block beats two
        return _SMALL, _SMALL
    if rows_per_expert <= 160:
        return _MEDIUM, _MEDIUM
    return _PREFILL, _PREFILL


# Decode (<= DECODE_MAX_ROWS_PER_EXPERT routed rows per expert) runs the Gluon kernels (mma.sync below 2
# rows, the wgmma ring kernels from there) on sm90 when the shape fits their tiles; figures:
# bench/moe_kernel_notes.md. From 33 to 64 rows the split ring (below) takes up to 39% less time than
# the Triton kernels' 64-row tiles, and never more than 1% more (H200, 2026-11-25, cold L2, 20 reps:
# Flash 64 experts 40 rows 706 vs 778 us uniform, 640 vs 1011 Zipf; 64 rows 951 vs 1133, 916 vs 1150;
# Pro 48 64 rows 1874 vs 2177, 1760 vs 2173; 48 rows uniform 1505 vs 1493): past 64 rows, not measured
# against each other, the Triton tiles stay.
DECODE_MAX_ROWS_PER_EXPERT = 64
# (L1, L2) decode tiles; the two GEMMs need only share the routing block (block_t). Routing is never
# balanced: at an average of 8 rows per expert the busiest expert gets 14-20 rows (uniform top-6 draws
# over 32-64 experts) and 45-72 under Zipf-1.1 skew, so an 8-token block splits most experts in two
# and the weights are dequantized twice. Measured on an H200 with the L2 flushed before every call
# (bench/tools/decode_profile.py, Flash/Pro at 32/48/64 experts, uniform and Zipf):
# - below 0.5 rows (a few tokens): L1 8 warps x 1 m-tile x BK=256, L2 2 m-tiles x BK=128 with register
#   prefetch;
# - 0.5 to 5 rows: the wgmma kernels (_decode_wgmma.py), 16 tokens, one warpgroup x 64 rows, BK=128,
#   weights, scales and token tiles through a 4-slot cp.async ring (3 K steps in flight), the scales
#   four K steps at a time in 16-byte copies. With the expert bytes in tiles.py's layout (what
#   triton_w4a16 prepares on sm90), whose words the dequant reads in 6 integer-pipe ops, it beats the
#   8-token mma.sync pair from 0.5 rows (H200, 2026-11-26, cold L2: 7-16% less time at 1.5 rows on all
#   four loads, 1-14% at 1 row but for a tie at Flash 32 Zipf, 5-15% at 0.5 rows on six of eight
#   loads); at 0.1-0.25 rows the two are within -20..+14% of each other.
#   Fallbacks where it does not divide the shape (64-row tiles, K steps a multiple of 4): the 8-token
#   tile (2 m-tiles x BK=256 x 4 warps), then the two 8-token tiles of 1 row;
# - over 5 to 64 rows: the same ring tile, but experts holding more than 16 rows in 32-token blocks
#   (big_t, routing.align_split) of their own launches, on a side stream next to the small experts'
#   (SPLIT_STREAMS): with 16-token blocks only, a busy expert is dequantized once per 16 rows (five to
#   ten times under Zipf skew); with 32-token blocks only, the many experts of at most 16 rows pay the
#   bigger tile (fewer CTAs per SM). H200, 2026-11-25 22:45 UTC, cold L2, 30 reps (RESULTS_HISTORY.md, "the
#   routing in one launch per expert"): against the 16-token ring, Zipf 6-10 rows 2-15% less time
#   (Flash 64 10 rows 348 vs 410 us), uniform 6-10 rows -3..+6% (Flash 32 6 rows 185 vs 175); against
#   the 32-token ring at 16-32 rows up to 10% less (Flash 32 16 rows 181 vs 201, Flash 64 Zipf 408 vs
#   437), never more than 1.5% more (24-32 rows uniform). One after the other on one stream the two
#   routings took 1-16% more time at 12-20 rows than side by side (same day, Flash 32 12 rows uniform
#   223 vs 192 us), within 3% either way at 8 rows. Fallbacks: the 16-token
#   mma.sync pair (L1 2 warps x 2 m-tiles x BK=128, L2 4 warps) to 16 rows, the 32-token mma.sync
#   tile (2 m-tiles x BK=64) to 32, then the Triton tiles.
_DECODE_FEW = (DecodeConfig(block_t=8, mrep=1, block_k=256, num_warps=8, prefetch=0),
               DecodeConfig(block_t=8, mrep=2, block_k=128, num_warps=4, prefetch=1))
_DECODE_T8 = (DecodeConfig(block_t=8, mrep=2, block_k=256, num_warps=4, prefetch=0),) * 2
_DECODE_T16_RING = (DecodeConfig(block_t=16, mrep=1, block_k=128, num_warps=4, prefetch=3, wgmma=3),) * 2
_DECODE_SPLIT_RING = (DecodeConfig(block_t=16, mrep=1, block_k=128, num_warps=4, prefetch=3, wgmma=3, big_t=32),) * 2
_DECODE_T16 = (DecodeConfig(block_t=16, mrep=2, block_k=128, num_warps=2, prefetch=0),
               DecodeConfig(block_t=16, mrep=2, block_k=128, num_warps=4, prefetch=0))
# the 32-token ring (sweep candidate; the split's busy-expert tile)
_DECODE_T32_RING = (DecodeConfig(block_t=32, mrep=1, block_k=128, num_warps=4, prefetch=3, wgmma=3),) * 2
_DECODE_T32 = (DecodeConfig(block_t=32, mrep=2, block_k=64, num_warps=4, prefetch=0),) * 2
# the largest average rows per expert each choice takes: the two 8-token pairs, the 16-token ring, and
# (fallbacks of the split ring) the 16- and the 32-token mma.sync tiles
DECODE_FEW_MAX_ROWS, DECODE_RING16_MAX_ROWS, DECODE_T16_MAX_ROWS, DECODE_T32_MAX_ROWS = 0.5, 5.0, 16.0, 32.0


def decode_available(device: torch.device) -> bool:
    """Whether the Gluon decode kernels run on ``device``: sm90 (the only arch they were run and
    tested on) with Triton >= 3.6."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return False
    try:
        import triton.experimental.gluon  # noqa: F401  (Triton >= 3.6)
    except ImportError:
        return False
    return True


def decode_pair(rows_per_expert: float, hidden: int, inter: int) -> tuple[DecodeConfig, DecodeConfig] | None:
    """(L1, L2) decode tiles for this load and shape where the decode kernels are available: the
    measured pair for the load, else (shapes that do not divide into it) the first of the other
    pairs with the same routing block that fits, either pair's L2 tile for both GEMMs included."""
    if rows_per_expert > DECODE_MAX_ROWS_PER_EXPERT:
        return None
    if rows_per_expert < DECODE_FEW_MAX_ROWS:
        order = (_DECODE_FEW, _DECODE_T8)
    elif rows_per_expert <= DECODE_RING16_MAX_ROWS:
        order = (_DECODE_T16_RING, _DECODE_T8, _DECODE_FEW)
    elif rows_per_expert <= DECODE_T16_MAX_ROWS:
        order = (_DECODE_SPLIT_RING, _DECODE_T16)
    elif rows_per_expert <= DECODE_T32_MAX_ROWS:
        order = (_DECODE_SPLIT_RING, _DECODE_T32)
    else:
        order = (_DECODE_SPLIT_RING,)
    pairs = [q for p in order for q in (p, (p[1], p[1]), (p[0], p[0]))]
    return next((p for p in pairs if all(c.fits(hidden, inter) for c in p)), None)


def pick_decode(rows_per_expert: float, hidden: int, inter: int, device: torch.device) -> tuple[DecodeConfig, DecodeConfig] | None:
    """(L1, L2) decode tiles, or None where the Triton kernels are used instead."""
    if rows_per_expert > DECODE_MAX_ROWS_PER_EXPERT or not decode_available(device):
        return None
    return decode_pair(rows_per_expert, hidden, inter)


def pick_tiles(rows_per_expert: float, hidden: int, inter: int, decode: bool) -> tuple[TileConfig, TileConfig] | tuple[DecodeConfig, DecodeConfig]:
    """The (L1, L2) tiles a call runs: the decode kernels' where ``decode`` (decode_available)
    and the load and shape suit them, else the Triton kernels' heuristic."""
    return (decode and decode_pair(rows_per_expert, hidden, inter)) or pick_config(rows_per_expert)


def _t(*a, **kw) -> tuple[TileConfig, TileConfig]:
    c = TileConfig(*a, **kw)
    return c, c


# (L1, L2) pairs the benchmark's --sweep tries besides the heuristic's pick.
CANDIDATES: tuple[tuple[TileConfig, TileConfig], ...] = (
    _t(16, 64, 256, 4, 3, deq=1),  # per-element dequant, for comparison
    _t(16, 64, 128, 4, 5),
    _t(16, 32, 256, 4, 4),
    (TileConfig(16, 32, 256, 4, 4), TileConfig(16, 64, 256, 4, 4)),
    _t(32, 64, 256, 4, 4),
    _t(64, 64, 128, 4, 4),
    _t(64, 128, 128, 4, 4),
    _t(128, 64, 64, 4, 4),
    _t(128, 128, 64, 8, 4),
    (TileConfig(256, 64, 64, 8, 4), TileConfig(256, 128, 64, 8, 4)),
)
# Decode-kernel pairs the benchmark's --sweep tries (shapes permitting).
DECODE_CANDIDATES: tuple[tuple[DecodeConfig, DecodeConfig], ...] = tuple(
    (DecodeConfig(bt, m, bk, w, st), DecodeConfig(bt, m, bk, w, st))
    for bt, m, bk, w, st in ((8, 1, 128, 4, 1), (8, 1, 128, 8, 1), (8, 1, 256, 8, 0), (8, 2, 128, 4, 1),
                             (16, 2, 128, 4, 0), (16, 2, 128, 4, 1), (16, 2, 128, 8, 0),
                             (8, 1, 256, 4, 0), (8, 1, 256, 8, 1), (16, 1, 256, 8, 0), (16, 1, 256, 4, 0),
                             (32, 1, 128, 4, 0), (32, 1, 128, 8, 0), (32, 2, 64, 4, 0), (32, 2, 128, 4, 0),
                             (32, 1, 64, 8, 0), (32, 1, 128, 4, 1), (32, 1, 256, 8, 0), (32, 2, 64, 8, 0),
                             (8, 2, 256, 4, 0), (16, 2, 128, 2, 0))
) + tuple(  # the wgmma kernels (block_t, mrep, block_k, warps, prefetch, wgmma: 1-2 staged chunks, 3 the ring)
    (DecodeConfig(bt, m, bk, w, pf, wg), DecodeConfig(bt, m, bk, w, pf, wg))
    for bt, m, bk, w, pf, wg in ((16, 1, 128, 8, 1, 1), (16, 1, 128, 4, 2, 1), (16, 1, 128, 8, 1, 2),
                                 (16, 1, 128, 4, 1, 3), (16, 1, 128, 4, 3, 3), (16, 1, 256, 4, 1, 3),
                                 (16, 1, 256, 4, 3, 3), (32, 1, 256, 4, 1, 3), (16, 2, 128, 4, 1, 3),
                                 (8, 1, 256, 4, 1, 3), (32, 1, 128, 4, 3, 3))
) + (_DECODE_SPLIT_RING,)  # the 16-token ring, busy experts in 32-token blocks
# Diagnostics for --sweep --diag (WRONG numbers, never selected): same loads and MMAs, no dequant.
DIAG = (_t(16, 64, 256, 4, 3, deq=9), _t(128, 64, 64, 4, 3, deq=9))


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

    cfg1, cfg2 = config or pick_tiles(rows_per_expert, hidden, inter, decode_available(x.device))
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
    # one Triton launch instead of ~20 torch kernels where the slot count is decode-sized
    if decode and cfg1.big_t:  # two routings, each run on its own launches of the same kernels
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
    rows = scratch((tokens * top_k, hidden), float("nan"), dtype=torch.bfloat16, device=x.device)
    route_w = topk_weights.to(torch.float32).reshape(-1).contiguous()
    limit = float(swiglu_limit) if swiglu_limit is not None else 0.0
    has_limit = swiglu_limit is not None
    x_in = xb
    if decode and cfg1.wgmma:
        from nvfp4stack.kernels.moe.hopper_w4a16.k_order import permute_k

        # cp.async stages the activations verbatim: x goes in the weights' K order (one strided copy),
        # and L1 writes h in L2's
        x_in = permute_k(xb, cfg1.block_k)
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
        launches.append((c1, c2, l1_args, l2_args, routing.max_blocks, inter, hidden, limit, has_limit, tiled))
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
    return _topk_sum(rows, topk_ids, hidden, out_dtype)


# split decode (DecodeConfig.big_t): the busy experts' launches on a side stream (False: after the small ones)
SPLIT_STREAMS = True
_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def _launch_gemms(cfg1, cfg2, l1_args: tuple, l2_args: tuple, nblocks: int, inter: int, hidden: int, limit: float,
                  has_limit: bool, tiled: bool) -> None:
    """L1 then L2 over ``nblocks`` routing blocks, on the kernels the (L1, L2) tiles name."""
    if isinstance(cfg1, DecodeConfig):
        if cfg1.wgmma:
            from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_wgmma as kernels
        else:
            from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_gluon as kernels
        kernels.launch(cfg1, cfg2, l1_args, l2_args, nblocks, inter, hidden, limit, has_limit, tiled)
        return
    from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import l1_swiglu_kernel, l2_combine_kernel

    grid1 = (nblocks * triton_cdiv(inter, cfg1.block_n),)
    l1_swiglu_kernel[grid1](*l1_args, nblocks, limit, HAS_LIMIT=has_limit, TILED=tiled, **cfg1.launch_args(hidden))
    grid2 = (nblocks * triton_cdiv(hidden, cfg2.block_n),)
    l2_combine_kernel[grid2](*l2_args, nblocks, TILED=tiled, **cfg2.launch_args(inter))


def _weight_args(data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> tuple:
    """Packed [E, N, K/2] weights and [E, N, K/16] scales with their expert and row strides."""
    return (data, data.stride(0), data.stride(1), scale, scale.stride(0), scale.stride(1), global_scale)


def _topk_sum(rows: torch.Tensor, topk_ids: torch.Tensor, hidden: int, out_dtype) -> torch.Tensor:
    """Top-k combine in fp32 (like vLLM's moe_sum), one launch; slots of negative ids skipped."""
    from nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels import topk_sum_kernel

    tokens, top_k = topk_ids.shape
    out = torch.empty((tokens, hidden), dtype=out_dtype, device=rows.device)
    block = 1024
    topk_sum_kernel[(tokens, triton_cdiv(hidden, block))](rows, topk_ids.contiguous(), out, hidden, TOP_K=top_k,
                                                          BLOCK=block, num_warps=4)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
