"""Which tiles a ``triton_w4a16`` call runs: the Triton kernels' tile configs and the Gluon decode kernels'
(L1, L2) pairs, picked from the average routed rows per expert and the shape; the benchmarks' sweep candidates.
Pure Python plus a device query: CPU hosts import it (heuristics, tests, benchmarks)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch


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
    prefetch: int = 0  # 1: the next K step's weights are loaded before this step's math (2: its activations too); 0: not
    # 1: the wgmma kernels (_decode_wgmma.py: token tile staged in shared memory per CTA, chunks of
    # chunk_k columns, weights prefetched ``prefetch`` K steps ahead), 2: the same with each step's
    # wgmma left in flight while the next step dequantizes; 3: weights and token tiles through one
    # cp.async ring, ``prefetch`` K steps in flight; 0: the mma.sync kernels (_decode_gluon.py)
    wgmma: int = 0
    chunk_k: int = 512
    # ring tiles (wgmma 3) only: experts with more than block_t routed rows run in blocks of big_t tokens,
    # the same tile otherwise, in launches of their own (routing.align_split); 0: every expert in block_t blocks
    big_t: int = 0
    # mma.sync tiles (wgmma 0) only: the reduction dim is cut into ``split_k`` equal runs of K steps, each run
    # a CTA of its own (grid axis 2), so that a load of one or two tokens, whose weight rows give too few
    # warps to keep enough bytes in flight, fills the GPU. The runs' fp32 partials are summed in run order:
    # L1's by the tile's last run to finish (a count per tile), before its SwiGLU; L2's by the top-k sum.
    split_k: int = 1
    # mma.sync tiles only: Triton's register cap a thread (0: the compiler's choice), so that more CTAs fit on an
    # SM where the grid has more than fit (e.g. 80 at 256 threads: 3 CTAs, where the prefetch-2 L1 tile at BK 256
    # takes 101 registers uncapped, 2 CTAs; Triton 3.6)
    maxnreg: int = 0

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
                                             and inter // self.block_k % self.ring_slots == 0))
                and hidden // self.block_k % self.split_k == 0 and inter // self.block_k % self.split_k == 0)

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
        if self.prefetch not in ((1, 2, 3, 7) if self.wgmma else (0, 1, 2)) or self.block_t not in (8, 16, 32) or self.block_k % 64:
            raise ValueError(f"DecodeConfig: prefetch 0|1|2 (wgmma tiles: 1, 2, 3 or 7 K steps ahead), block_t "
                             f"8|16|32, block_k a multiple of 64; got {self}")
        if self.wgmma not in (0, 1, 2, 3) or (self.wgmma and self.num_warps % 4):
            raise ValueError(f"DecodeConfig: wgmma 0-3, and wgmma tiles take whole warpgroups (num_warps 4, 8, 12, "
                             f"16); got {self}")
        if self.big_t and (self.wgmma != 3 or self.big_t not in (16, 32) or self.big_t <= self.block_t):
            raise ValueError(f"DecodeConfig: big_t (the busy experts' token block) is 0, or 16 or 32 tokens over "
                             f"block_t on a ring tile (wgmma 3); got {self}")
        if self.maxnreg and (self.wgmma or self.maxnreg % 8 or not 24 <= self.maxnreg <= 248):
            raise ValueError(f"DecodeConfig: maxnreg (a thread's register cap) is 0 (the compiler's choice), or a "
                             f"multiple of 8 from 24 to 248 on the mma.sync tiles (wgmma 0) only; got {self}")
        if self.split_k not in (1, 2, 4, 8) or (self.split_k > 1 and self.wgmma):
            raise ValueError(f"DecodeConfig: split_k (K runs per tile, each its own CTA) is 1, 2, 4 or 8, and more "
                             f"than 1 on the mma.sync tiles (wgmma 0) only; got {self}")
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
#   prefetch of the weights and the activations;
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
# L2 loads the next K step's activations with its weight words (prefetch 2; was 1 until 2026-11-28): same bits,
# 0.95-1.10x at 44 loads of 1-16 tokens (geomean 1.04x, 39 at >= 1.00x; bench/tools/decode_pick_ab.py, RESULTS.md
# "Issue #35: the few-token pair's second GEMM prefetches its activations")
_DECODE_FEW = (DecodeConfig(block_t=8, mrep=1, block_k=256, num_warps=8, prefetch=0),
               DecodeConfig(block_t=8, mrep=2, block_k=128, num_warps=4, prefetch=2))
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


# split_k (DecodeConfig) is chosen per call from the CTAs a launch would have: a GEMM whose grid (routing
# blocks x n-tiles) gives fewer than FILL_CTAS_PER_SM programs per SM is cut into 2, 4 or 8 K runs, the
# fewest that reach it. H200 (132 SMs), 2026-11-27, cold L2, 3 interleaved rounds (ranges within 1%,
# bench/RESULTS.md "split-K for one-token decode"): Flash 256 and 64 experts at one token (192 CTAs per
# GEMM, 1.5 per SM) took 46.2-47.6 us split in two against 56.7-59.0 unsplit (1.23-1.26x), split in four
# 1.15-1.17x; at two tokens (384 CTAs) splitting cost 4-12%, and so it did for Pro at one token (288 and
# 336 CTAs: 0.88-0.91x).
FILL_CTAS_PER_SM = 2


def fill_split(pair, slots: int, num_experts: int, hidden: int, inter: int, sm_count: int):
    """``pair`` with split_k set on each mma.sync decode tile whose launch would leave the GPU under-filled
    (above). The grid is estimated from the call's routed ``slots`` over ``num_experts`` as routing spreads
    them evenly (each expert's rows in block_t-token blocks, never more blocks than slots): exact at one slot
    per expert, and an over-estimate under skew or expert parallelism, which only splits less. ``sm_count``:
    the GPU's SMs (0: no split). Other tiles (Triton, wgmma, tiles already split) are returned as they are."""
    l1, l2 = pair
    if not sm_count or not all(isinstance(c, DecodeConfig) and not c.wgmma and c.split_k == 1 for c in pair):
        return pair
    blocks = _blocks(slots, num_experts, l1.block_t)

    def split(c: DecodeConfig, n_tiles: int) -> DecodeConfig:
        s = 1
        while (blocks * n_tiles * s < FILL_CTAS_PER_SM * sm_count and s < 8
               and replace(c, split_k=2 * s).fits(hidden, inter)):
            s *= 2
        return replace(c, split_k=s)

    return split(l1, inter // (l1.rows // 2)), split(l2, hidden // l2.rows)


def _blocks(slots: int, num_experts: int, block_t: int) -> int:
    """Routing blocks of a call's ``slots`` spread evenly over ``num_experts`` (fill_split's estimate)."""
    return min(slots, num_experts * -(-slots // (num_experts * block_t)))


# The few-token pair's L1 loads its next K step's weights ahead (prefetch 1) under a register cap that keeps 3 of its
# 256-thread CTAs on an SM (80: no spill, Triton 3.6; uncapped it takes 100, 2 an SM), where its whole launch then
# runs at once. H200 (132 SMs), 2026-11-29, L2 flushed clean, 5 interleaved rounds (bench/RESULTS.md, seventeenth
# visit; `decode_pick_ab.py --only l1p1r80`): 1.06-1.09x at one token on the Flash shapes (384 CTAs), 1.04-1.05x at
# two (352-384), 1.02x at Pro one token (288); where the launch is larger, 0.88x (Pro two tokens, 480) and 0.92x (Flash
# 256 four tokens Zipf, 672), so not there. The same bits: prefetching changes no arithmetic.
L1_PREFETCH_MAXNREG = 80


def prefetch_l1(pair, slots: int, num_experts: int, inter: int, sm_count: int):
    """``pair`` with _DECODE_FEW's L1 (any split) at prefetch 1 under L1_PREFETCH_MAXNREG where its launch fits the
    SMs at once at that register count; any other pair as it is."""
    l1, l2 = pair
    if not sm_count or not isinstance(l1, DecodeConfig) or l1 != replace(_DECODE_FEW[0], split_k=l1.split_k):
        return pair
    ctas = _blocks(slots, num_experts, l1.block_t) * (inter // (l1.rows // 2)) * l1.split_k
    if ctas > 65536 // (L1_PREFETCH_MAXNREG * 32 * l1.num_warps) * sm_count:
        return pair
    return replace(l1, prefetch=1, maxnreg=L1_PREFETCH_MAXNREG), l2


@lru_cache(maxsize=4096)
def pick_call(rows_per_expert: float, slots: int, num_experts: int, hidden: int, inter: int, decode: bool,
              sm_count: int):
    """The (L1, L2) tiles one forward call runs with no override: ``pick_tiles`` for its load, then
    ``fill_split`` and ``prefetch_l1`` for its grid. The forward, the warm-up's launch keys and the benchmarks all ask
    here (cached: the same few loads come back at every decode step)."""
    pair = fill_split(pick_tiles(rows_per_expert, hidden, inter, decode), slots, num_experts, hidden, inter, sm_count)
    return prefetch_l1(pair, slots, num_experts, inter, sm_count)


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
) + (_DECODE_SPLIT_RING,) + tuple(  # the 16-token ring, busy experts in 32-token blocks; then split-K mma.sync pairs
    (DecodeConfig(bt, m1, bk1, w1, pf1, split_k=s1), DecodeConfig(bt, m2, bk2, w2, pf2, split_k=s2))
    for bt, (m1, bk1, w1, pf1, s1), (m2, bk2, w2, pf2, s2) in (
        (8, (1, 256, 8, 0, 2), (2, 128, 4, 1, 2)), (8, (1, 256, 4, 0, 4), (2, 128, 4, 1, 4)),
        (8, (1, 128, 4, 1, 4), (1, 128, 4, 1, 4)), (8, (1, 256, 8, 0, 1), (2, 128, 4, 1, 4)),
        (8, (1, 128, 4, 1, 8), (1, 64, 4, 1, 8)), (16, (1, 128, 4, 0, 2), (1, 128, 4, 0, 2)),
        # activations prefetched too (prefetch 2), grids that fit on the SMs at once at one token (H200, 2026-11-28:
        # the first two slower than the pick at one token, 49.3 and 53.9 us against 43.8; the third is _DECODE_FEW
        # split in 2, the pick at one token since then)
        (8, (1, 128, 8, 2, 2), (2, 128, 4, 2, 2)), (8, (1, 128, 8, 2, 2), (1, 128, 8, 2, 2)),
        (8, (1, 256, 8, 0, 2), (2, 128, 4, 2, 2)))
) + (  # L1 at BK 256 with prefetch 2 capped at 80 registers: 3 CTAs of 256 threads an SM instead of 2 (101 registers
    # uncapped; capped it spills, 80 bytes of stack under Triton 3.6, and took twice the pick's time at every load)
    (DecodeConfig(8, 1, 256, 8, 2, split_k=2, maxnreg=80), DecodeConfig(8, 2, 128, 4, 2, split_k=2)),
)
# Diagnostics for --sweep --diag (WRONG numbers, never selected): same loads and MMAs, no dequant.
DIAG = (_t(16, 64, 256, 4, 3, deq=9), _t(128, 64, 64, 4, 3, deq=9))
