"""triton_w4a16 fused MoE vs the torch_emulation twin (fp32 on the dequantized weights), both
through the backend interface (prepare/apply) where no tile override is asked for.

GPU tests: fresh random data each run (seed printed), scratch poisoned with NaN before each
launch, ragged routing (experts with 0 tokens, one with most), token counts off the tile grid.
"""
import os

import pytest
import torch

from nvfp4stack.arch import KNOWN_ARCHS
from nvfp4stack.kernels.base import MOE_BACKENDS
from nvfp4stack.schemes import Scheme

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU with Triton")
LIMIT = 10.0


def test_registration_and_arch_verdicts():
    import sys

    import nvfp4stack.kernels.moe.triton_w4a16  # noqa: F401  (registers the backend)

    be = MOE_BACKENDS.get("triton_w4a16")
    assert be.kind == "moe" and be.capabilities.provider == "nvfp4stack"
    ok, reason = be.is_supported(KNOWN_ARCHS["cpu"], Scheme.NVFP4)
    assert not ok and "CUDA" in reason and "torch_emulation" in reason
    for name in ("sm80", "sm89", "sm90", "sm100a", "sm120"):
        ok, reason = be.is_supported(KNOWN_ARCHS[name], Scheme.NVFP4)
        assert ok and "weight-only" in reason, name
    assert be.can_implement(Scheme.NVFP4)[0] and be.can_implement(Scheme.NVFP4_W4A16)[0]
    assert not be.can_implement(Scheme.FP8_BLOCK)[0]
    if not torch.cuda.is_available():
        # CPU hosts import the module for registration only: Triton must not come with it
        assert "nvfp4stack.kernels.moe.hopper_w4a16._triton_kernels" not in sys.modules


def test_pick_decode_tiles(monkeypatch):
    """Decode tiles (CPU: the sm90 answer with the capability query patched): below 0.5 rows/expert an
    L1 and an L2 tile of their own, from 0.5 to 5 the 16-token wgmma ring tile, over 5 to 64 the same
    with busy experts (over 16 rows) in 32-token blocks (big_t), and none past 64 rows, off sm90 or on
    CPU tensors; shapes that do not divide into a tile get the next that fits (the 8-token tile to 5
    rows, then the mma.sync 16-token pair, L1 on 2 warps and L2 on 4, the 32-token mma.sync tile over
    16 to 32 rows, the Triton tiles past 32)."""
    pytest.importorskip("triton.experimental.gluon")
    from dataclasses import replace

    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as tw

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    for hidden, inter in ((4096, 2048), (7168, 3072)):  # DSV4 Flash, Pro
        l1, l2 = tw.pick_decode(0.25, hidden, inter, cuda)
        assert (l1.block_t, l2.block_t) == (8, 8) and l1 != l2
        assert (l1.num_warps, l1.mrep, l1.block_k) == (8, 1, 256)
        assert tw.pick_decode(0.49, hidden, inter, cuda) == (l1, l2)
        t16 = tw.pick_decode(0.5, hidden, inter, cuda)
        assert t16[0] == t16[1] and t16[0].wgmma == 3 and not t16[0].big_t
        assert (t16[0].block_t, t16[0].mrep, t16[0].block_k, t16[0].num_warps, t16[0].prefetch) == (16, 1, 128, 4, 3)
        assert tw.pick_decode(1, hidden, inter, cuda) == t16 and tw.pick_decode(5, hidden, inter, cuda) == t16
        split = tw.pick_decode(5.01, hidden, inter, cuda)
        assert split[0] == split[1] and split[0] == replace(t16[0], big_t=32)
        assert all(tw.pick_decode(r, hidden, inter, cuda) == split for r in (8, 16, 16.01, 32, 33, 64))
        assert tw.pick_decode(64.1, hidden, inter, cuda) is None
        assert tw.pick_config(64.1)[0].block_m == 64  # one 64-row Triton block
    t8 = tw.pick_decode(4, 1152, 640, cuda)  # 640 % 256 != 0: an 8-token tile with BK=128
    assert t8[0].block_t == 8 and all(c.block_k == 128 for c in t8)
    l1, l2 = tw.pick_decode(0.25, 1152, 640, cuda)  # 1152 % 256 != 0: the L1 tile does not fit
    assert l1 == l2 and l1.block_k == 128
    # 1152 / 128 = 9 K steps: no multiple of the ring's 4 slots, so an 8-token tile to 6 rows (BK=128:
    # 1152 % 256 != 0), then the 16-token mma.sync pair
    assert all(c.block_t == 8 and not c.wgmma and c.block_k == 128 for c in tw.pick_decode(4, 1152, 1024, cuda))
    for rows in (8, 12):
        m16 = tw.pick_decode(rows, 1152, 1024, cuda)
        assert not m16[0].wgmma and (m16[0].num_warps, m16[1].num_warps) == (2, 4)
    assert not tw.pick_decode(24, 1152, 1024, cuda)[0].wgmma  # likewise the 32-token mma.sync tile
    assert tw.pick_decode(40, 1152, 1024, cuda) is None  # and past 32 rows the Triton tiles
    assert tw.pick_decode(1, 2880, 2880, cuda) is None  # 2880 is no multiple of either BK (128, 256)
    assert tw.pick_decode(1, 4096, 2048, torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (10, 0))
    assert tw.pick_decode(1, 4096, 2048, cuda) is None


def test_decode_config_ring_slots():
    """The ring tiles' slot count is what their K steps must divide into, and a power of two (the
    scales of one round of slots arrive 16 bytes per row); an unknown kernel kind is refused when
    the tile is built."""
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import DecodeConfig

    ring = DecodeConfig(32, 1, 128, 4, 3, 3)
    assert ring.ring_slots == 4 and DecodeConfig(16, 1, 128, 4, 1, 3).ring_slots == 2
    assert DecodeConfig(16, 1, 128, 4, 1, 1).ring_slots == 0 and DecodeConfig(8, 2, 256, 4, 0).ring_slots == 0
    assert ring.fits(4096, 2048) and ring.fits(7168, 3072)
    assert not ring.fits(1152, 1024)  # 9 K steps: no multiple of 4 slots
    assert DecodeConfig(16, 1, 128, 4, 1, 3).fits(256, 256) and not DecodeConfig(16, 1, 128, 4, 1, 3).fits(384, 384)
    with pytest.raises(ValueError, match="wgmma 0-3"):
        DecodeConfig(16, 1, 128, 4, 3, 4)
    # the ring's scales arrive a round of slots at a time, 16 bytes per row: 3 slots of BK=128 are 24
    with pytest.raises(ValueError, match=r"prefetch 1, 3 or 7 at block_k 128.*prefetch=2"):
        DecodeConfig(16, 1, 128, 4, 2, 3)
    with pytest.raises(ValueError, match="power of two"):
        DecodeConfig(16, 1, 64, 4, 1, 3)  # 2 slots of BK=64: 8 bytes per row
    # the busy experts' blocks (big_t): ring tiles only, more tokens than block_t
    assert DecodeConfig(16, 1, 128, 4, 3, 3, big_t=32).fits(4096, 2048)
    for bad in (dict(wgmma=0, prefetch=0), dict(big_t=16), dict(big_t=64)):
        with pytest.raises(ValueError, match="big_t"):
            DecodeConfig(**{**dict(block_t=16, mrep=1, block_k=128, num_warps=4, prefetch=3, wgmma=3, big_t=32), **bad})


def _gen(device) -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator(device=device).manual_seed(seed)


def _problem(g, experts, hidden, inter, tokens, top_k, device="cuda"):
    from nvfp4stack.formats.nvfp4 import quantize_nvfp4

    # per-row magnitudes vary so blocks get different scales; x large enough to hit the clamp
    w13 = torch.randn(experts, 2 * inter, hidden, device=device, generator=g)
    w13 *= torch.rand(experts, 2 * inter, 1, device=device, generator=g) * 3 / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device=device, generator=g) / inter**0.5
    x = (torch.randn(tokens, hidden, device=device, generator=g) * 4).bfloat16()
    probs = torch.rand(experts, device=device, generator=g) + 0.05
    probs[0] = 10.0 * experts  # one expert takes most of the tokens
    probs[1] = 0  # and some take none
    probs[-1] = 0
    ids = (torch.multinomial(probs.expand(tokens, -1), top_k, generator=g) if tokens
           else torch.empty(0, top_k, dtype=torch.int64, device=device)).to(torch.int32)
    wts = torch.softmax(torch.randn(tokens, top_k, device=device, generator=g), -1)
    return x, quantize_nvfp4(w13, name="w13"), quantize_nvfp4(w2, name="w2"), wts, ids


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _run(name, x, w13, w2, wts, ids, swiglu_limit):
    """Backend ``name`` through the interface: prepare the packed experts, apply."""
    from nvfp4stack.kernels.base import MoeWeights, load_backends

    load_backends()
    be = MOE_BACKENDS.get(name)
    return be.apply(be.prepare(MoeWeights(w13, w2)), x, wts, ids, swiglu_limit=swiglu_limit)


def _check(x, w13, w2, wts, ids, config=None, label=""):
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton

    ref = _run("torch_emulation", x.float(), w13, w2, wts, ids, LIMIT)
    if config is None:
        out = _run("triton_w4a16", x, w13, w2, wts, ids, LIMIT)
    else:  # a tile override (and NaN-poisoned scratch) is the kernel's own knob, not the interface's
        out = nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=config, poison=True)
    torch.cuda.synchronize()
    err = _rel(out, ref)
    print(f"{label} T={x.shape[0]} k={ids.shape[1]} E={w13.shape[0]} H={x.shape[1]} "
          f"I={w2.shape[2]} cfg={config[0] if config else 'heuristic'}: rel err {err:.2e}")
    assert out.dtype == x.dtype and out.shape == x.shape
    assert bool(torch.isfinite(out).all()), "NaN/Inf in output: an element was not written"
    assert err <= 1e-2
    return err


def test_fill_split_cuts_under_filled_decode_launches():
    """split_k from the CTAs a launch has (tile_choice.fill_split): the measured cases (H200, 132 SMs) and
    what it leaves alone."""
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import (
        _DECODE_FEW,
        _DECODE_T16_RING,
        DecodeConfig,
        TileConfig,
        fill_split,
    )

    def splits(slots, hidden, inter, pair=_DECODE_FEW, sms=132, experts=256):
        return [c.split_k for c in fill_split(pair, slots, experts, hidden, inter, sms)]

    assert splits(6, 4096, 2048) == [2, 2]  # Flash, one token: 192 CTAs per GEMM -> 384
    assert splits(12, 4096, 2048) == [1, 1]  # two tokens: 384 CTAs, splitting cost 4-12%
    assert splits(6, 7168, 3072, experts=48) == [1, 1]  # Pro, one token: 288 / 336 CTAs
    assert splits(6, 4096, 1024) == [4, 2]  # Flash at TP 2 (I 1024): L1 has 96 CTAs
    assert splits(1, 4096, 2048) == [8, 8]  # the cap
    assert splits(6, 4096, 2048, sms=0) == [1, 1]  # no GPU figure: as picked
    # K steps that do not divide: Pro's hidden 7168 is 28 steps of 256, so L1 goes no further than 4
    assert fill_split(_DECODE_FEW, 1, 48, 7168, 3072, 132)[0].split_k == 4
    # other tiles come back as they are
    ring = _DECODE_T16_RING
    assert fill_split(ring, 1, 256, 4096, 2048, 132) == ring
    triton = (TileConfig(16, 64, 256, 4, 3),) * 2
    assert fill_split(triton, 1, 256, 4096, 2048, 132) == triton
    pre = (DecodeConfig(8, 1, 256, 8, 0, split_k=2),) * 2
    assert fill_split(pre, 1, 256, 4096, 2048, 132) == pre
    # the grid counts blocks: on the 16-token fallback pair (16 and 8 row tiles), 40 slots over 8 experts are
    # 8 blocks (128 and 64 CTAs: split 4 and 4, the last capped by L2's 4 K steps), 600 slots are 40 blocks of
    # up to 16 tokens (640 and 320 CTAs: whole), where one block per active expert would have split them too
    t16 = (DecodeConfig(16, 2, 128, 2, 0), DecodeConfig(16, 2, 128, 4, 0))
    assert splits(40, 1024, 512, pair=t16, experts=8) == [4, 4]
    assert splits(600, 1024, 512, pair=t16, experts=8) == [1, 1]


def test_prefetch_l1_where_the_capped_launch_fits_the_gpu_at_once():
    """tile_choice.prefetch_l1: the few-token pair's L1 at prefetch 1 under 80 registers where its launch fits 3 CTAs
    an SM (H200, 132 SMs: 396), the measured wins and losses of 2026-11-29; the L2 tile and the splits untouched."""
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import (
        _DECODE_FEW,
        _DECODE_T16_RING,
        L1_PREFETCH_MAXNREG,
        fill_split,
        pick_call,
        prefetch_l1,
    )

    def l1(slots, experts, hidden, inter, sms=132):
        c = pick_call(slots / experts, slots, experts, hidden, inter, True, sms)[0]
        return c.prefetch, c.maxnreg, c.split_k

    on, off = (1, L1_PREFETCH_MAXNREG), (0, 0)
    assert l1(6, 256, 4096, 2048) == (*on, 2)  # Flash one token: 6 blocks x 32 n-tiles x split 2 = 384 CTAs
    assert l1(12, 256, 4096, 2048) == (*on, 1)  # two tokens: 384
    assert l1(6, 48, 7168, 3072) == (*on, 1)  # Pro one token: 288
    assert l1(12, 48, 7168, 3072) == (*off, 1)  # Pro two tokens: 480, measured 0.88x
    assert l1(24, 256, 4096, 2048) == (*off, 1)  # Flash four tokens: 768
    assert l1(6, 256, 4096, 2048, sms=114) == (*off, 2)  # 384 CTAs do not fit 114 SMs x 3
    assert l1(6, 256, 4096, 2048, sms=0) == (*off, 1)  # no GPU figure: as picked
    few = pick_call(6 / 256, 6, 256, 4096, 2048, True, 132)
    assert few[1] == fill_split(_DECODE_FEW, 6, 256, 4096, 2048, 132)[1]  # L2 as fill_split gives it
    assert prefetch_l1(_DECODE_T16_RING, 1, 256, 4096, 132) == _DECODE_T16_RING  # other pairs as they are
    assert prefetch_l1(few, 6, 256, 2048, 132) == few  # already prefetching: as it is


def test_split_k_config_is_checked():
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig

    assert DecodeConfig(8, 1, 256, 8, 0, split_k=4).fits(4096, 2048)
    assert not DecodeConfig(8, 1, 256, 8, 0, split_k=8).fits(7168, 3072)  # 28 K steps
    for bad in (dict(split_k=3), dict(split_k=2, wgmma=3, prefetch=3)):
        with pytest.raises(ValueError, match="split_k"):
            DecodeConfig(**{**dict(block_t=16, mrep=1, block_k=128, num_warps=4, prefetch=1), **bad})


def test_prefetch_2_and_the_register_cap_are_checked():
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DECODE_CANDIDATES, DecodeConfig

    assert DecodeConfig(8, 1, 128, 8, 2, split_k=2).fits(4096, 2048)   # activations prefetched too
    assert DecodeConfig(8, 1, 256, 8, 2, split_k=2, maxnreg=80).maxnreg == 80
    with pytest.raises(ValueError, match="prefetch 0|1|2"):
        DecodeConfig(8, 1, 128, 4, 3)
    for bad in (dict(maxnreg=84), dict(maxnreg=16), dict(maxnreg=256), dict(maxnreg=80, wgmma=3, prefetch=3)):
        with pytest.raises(ValueError, match="maxnreg"):
            DecodeConfig(**{**dict(block_t=8, mrep=1, block_k=128, num_warps=4, prefetch=2), **bad})
    assert DecodeConfig(8, 1, 128, 4, 2, maxnreg=248).maxnreg == 248
    # the sweep tries them at Flash's one-token shape (split 2: 384 CTAs a GEMM)
    new = [p for p in DECODE_CANDIDATES if any(c.prefetch == 2 and not c.wgmma for c in p)]
    assert len(new) == 4 and all(c.fits(4096, 2048) and c.split_k == 2 for p in new for c in p)
    assert any(c.maxnreg == 80 for p in new for c in p)


@gpu
@pytest.mark.gpu
def test_prefetch_2_and_the_register_cap_keep_the_bits():
    """Prefetching the activations too (prefetch 2), or capping the registers, changes when loads are issued,
    not what is summed in which order: the same bits as the prefetch-1 tile of the same shape and split."""
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import DecodeConfig, decode_available, nvfp4_moe_forward_triton

    if not decode_available(torch.device("cuda")):
        pytest.skip("the decode kernels run on sm90 only")
    g = _gen("cuda")
    for tokens in (1, 3):
        # hidden 2048, inter 1024 at split 2: 4 K steps a run, so the loop hands over between steps
        x, w13, w2, wts, ids = _problem(g, experts=16, hidden=2048, inter=1024, tokens=tokens, top_k=6)
        outs = {}
        for name, pair in {
            "p1": (DecodeConfig(8, 1, 256, 8, 1, split_k=2), DecodeConfig(8, 2, 128, 4, 1, split_k=2)),
            "p2": (DecodeConfig(8, 1, 256, 8, 2, split_k=2), DecodeConfig(8, 2, 128, 4, 2, split_k=2)),
            "p2 capped": (DecodeConfig(8, 1, 256, 8, 2, split_k=2, maxnreg=80),
                          DecodeConfig(8, 2, 128, 4, 2, split_k=2, maxnreg=96)),
        }.items():
            outs[name] = nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=pair)
            _check(x, w13, w2, wts, ids, config=pair, label=f"{name}, {tokens} token(s)")
        assert torch.equal(outs["p1"], outs["p2"]) and torch.equal(outs["p1"], outs["p2 capped"]), tokens


@gpu
@pytest.mark.gpu
def test_every_tile_config_small_ragged():
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import CANDIDATES, pick_config

    g = _gen("cuda")
    # I=192: N tail inside 128/256-wide tiles and K=192 forces 64-wide K tiles in L2;
    # 77 tokens x 6 slots: counts off every tile size
    prob = _problem(g, experts=8, hidden=256, inter=192, tokens=77, top_k=6)
    failures = []
    for cfg in CANDIDATES + tuple(pick_config(r) for r in (1, 32, 100, 1000)):
        try:
            _check(*prob, config=cfg, label="small")
        except AssertionError as exc:  # report every failing config, not just the first
            failures.append(f"{cfg}: {exc}")

    assert not failures, "\n".join(failures)


@gpu
@pytest.mark.gpu
def test_decode_kernel_every_config_ragged():
    """Gluon decode kernels (weights as the mma.sync M side): every candidate tile, ragged routing."""
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import DECODE_CANDIDATES, pick_decode

    g = _gen("cuda")
    # hidden 1024 / inter 512: 1-4 K steps, fewer than some pipelines' depth; 37 tokens x 6 slots:
    # one expert takes most (several token blocks of it), two experts none, partial last blocks
    prob = _problem(g, experts=8, hidden=1024, inter=512, tokens=37, top_k=6)
    failures = []
    picked = [pick_decode(r, 1024, 512, torch.device("cuda")) for r in (1, 4, 8, 16, 32)]
    for cfg in DECODE_CANDIDATES + tuple(p for p in picked if p is not None):
        if not (cfg[0].fits(1024, 512) and cfg[1].fits(1024, 512)):
            continue
        try:
            _check(*prob, config=cfg, label="decode")
        except AssertionError as exc:
            failures.append(f"{cfg}: {exc}")
    assert not failures, "\n".join(failures)
    assert pick_decode(1, 4096, 2048, torch.device("cuda")) is not None or torch.cuda.get_device_capability()[0] != 9


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("streams", [True, False])
@pytest.mark.parametrize("tokens,top_k,experts", [(3, 2, 8), (90, 6, 8), (40, 6, 16)])
def test_split_decode_tiles(tokens, top_k, experts, streams, monkeypatch):
    """Ring tiles with big_t: only small experts (the busy-expert launches find no block), only busy
    ones (the small launches find none), and both, under Zipf skew; NaN-poisoned scratch; the busy
    experts on a side stream (SPLIT_STREAMS) or after the small ones."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import DecodeConfig, decode_available

    if not decode_available(torch.device("cuda")):
        pytest.skip("the decode kernels run on sm90 only")
    monkeypatch.setattr(fused_moe, "SPLIT_STREAMS", streams)
    g = _gen("cuda")
    x, w13, w2, wts, _ = _problem(g, experts=experts, hidden=1024, inter=512, tokens=tokens, top_k=top_k)
    p = 1.0 / torch.arange(1, experts + 1, device="cuda", dtype=torch.float32) ** 1.1
    ids = torch.multinomial(p.expand(tokens, -1), top_k, generator=g).to(torch.int32)
    split = DecodeConfig(16, 1, 128, 4, 3, 3, big_t=32)
    _check(x, w13, w2, wts, ids, config=(split, split), label=f"split streams={streams}")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["w4a16", "fp8"])
@pytest.mark.parametrize("tokens", [3, 40, 300, 1500])
def test_other_ranks_slots_are_skipped(tokens, mode):
    """Expert parallel: slots routed to another rank's expert come as -1 and are computed by no block;
    the output equals the twin's with those slots on expert 0 at weight 0 (what other backends get).
    The 8 experts here are 8 of 32 (routed_experts): 0.5-280 rows per expert over the 32 cover the
    8-token tiles, the rings, the split ring, the Triton tiles and the FP8 mode."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import fp8_prefill
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import nvfp4_moe_forward_triton

    g = _gen("cuda")
    x, w13, w2, wts, ids = _problem(g, experts=8, hidden=1024, inter=512, tokens=tokens, top_k=6)
    other = torch.rand(ids.shape, device="cuda", generator=g) < 0.75
    other[0, 0] = False  # at least one slot stays here
    local = torch.where(other, -1, ids)
    fp8 = fp8_prefill.prepare_fp8_experts(w13, w2) if mode == "fp8" else None
    out = nvfp4_moe_forward_triton(x, w13, w2, wts, local, swiglu_limit=LIMIT, poison=True, mode=mode, fp8_weights=fp8,
                                   routed_experts=32)
    zeroed = torch.where(other, torch.zeros_like(wts), wts)
    if mode == "fp8":
        ref = fp8_prefill.fp8_moe_forward_emulated(x, fp8, zeroed, local.clamp(min=0), swiglu_limit=LIMIT)
    else:
        ref = _run("torch_emulation", x.float(), w13, w2, zeroed, local.clamp(min=0), LIMIT)
    torch.cuda.synchronize()
    err = _rel(out, ref)
    print(f"T={tokens} mode={mode} dropped {int(other.sum())}/{other.numel()} slots: rel err {err:.2e}")
    # FP8 against its own twin: rare E4M3 rounding flips (test_fp8_prefill.TWIN_TOL) weigh more on the
    # quarter of slots left here; H200, 24 runs: 1.4e-3 to 1.2e-2, so the twice-the-bound of few tokens
    assert bool(torch.isfinite(out).all()) and err <= (2e-2 if mode == "fp8" else 1e-2)


@gpu
@pytest.mark.gpu
def test_split_decode_in_cuda_graph():
    """The two-stream split inside a captured CUDA graph (as vLLM runs decode): replays see new inputs
    and equal the eager call bit for bit."""
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import DecodeConfig, decode_available, nvfp4_moe_forward_triton

    if not decode_available(torch.device("cuda")):
        pytest.skip("the decode kernels run on sm90 only")
    g = _gen("cuda")
    x, w13, w2, wts, _ = _problem(g, experts=16, hidden=1024, inter=512, tokens=40, top_k=6)
    p = 1.0 / torch.arange(1, 17, device="cuda", dtype=torch.float32) ** 1.1
    ids = torch.multinomial(p.expand(40, -1), 6, generator=g).to(torch.int32)
    split = (DecodeConfig(16, 1, 128, 4, 3, 3, big_t=32),) * 2
    run = lambda: nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=split)  # noqa: E731
    run()  # compiles outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for _ in range(2):  # new activations and routing, same buffers
        x.copy_(torch.randn(x.shape, generator=g, device="cuda", dtype=x.dtype))
        ids.copy_(torch.multinomial(p.expand(40, -1), 6, generator=g).to(torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run())
        _check(x, w13, w2, wts, ids, config=split, label="split graph")



@gpu
@pytest.mark.gpu
def test_split_k_in_cuda_graph_and_repeated_calls():
    """Split-K decode tiles (the per-tile counts of L1's runs) inside a captured CUDA graph: replays with new
    inputs equal the eager call bit for bit, repeated calls give the same bits, every count is back to
    zero after."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import decode_buffers
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import DecodeConfig, decode_available, nvfp4_moe_forward_triton

    if not decode_available(torch.device("cuda")):
        pytest.skip("the decode kernels run on sm90 only")
    g = _gen("cuda")
    x, w13, w2, wts, ids = _problem(g, experts=16, hidden=1024, inter=512, tokens=2, top_k=6)
    pair = (DecodeConfig(8, 1, 128, 4, 1, split_k=4), DecodeConfig(8, 2, 128, 4, 1, split_k=2))
    run = lambda: nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=pair)  # noqa: E731
    first = run()
    assert all(torch.equal(first, run()) for _ in range(5))
    _check(x, w13, w2, wts, ids, config=pair, label="split-k")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for _ in range(3):
        x.copy_((torch.randn(x.shape, generator=g, device="cuda") * 4).to(x.dtype))
        ids.copy_(torch.randint(0, 16, ids.shape, generator=g, device="cuda", dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run())
    assert int(decode_buffers._COUNTS[str(x.device)].abs().sum()) == 0

@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 40, 130, 1500])
def test_flash_shape_heuristic(tokens):
    g = _gen("cuda")
    prob = _problem(g, experts=32, hidden=4096, inter=2048, tokens=tokens, top_k=6)
    _check(*prob, label="flash")


@gpu
@pytest.mark.gpu
def test_clamp_is_exercised_and_matches():
    """Same data with and without the limit must differ, and both match the twin."""
    g = _gen("cuda")
    x, w13, w2, wts, ids = _problem(g, experts=4, hidden=128, inter=64, tokens=40, top_k=2)
    a = _run("triton_w4a16", x, w13, w2, wts, ids, LIMIT)
    b = _run("triton_w4a16", x, w13, w2, wts, ids, None)
    ref_b = _run("torch_emulation", x.float(), w13, w2, wts, ids, None)
    assert _rel(a, b) > 1e-2, "test data does not reach the clamp"
    assert _rel(b, ref_b) <= 1e-2


@gpu
@pytest.mark.gpu
def test_zero_tokens():
    g = _gen("cuda")
    x, w13, w2, wts, ids = _problem(g, experts=4, hidden=128, inter=64, tokens=0, top_k=2)
    out = _run("triton_w4a16", x, w13, w2, wts, ids, LIMIT)
    assert out.shape == (0, 128)


@gpu
@pytest.mark.gpu
def test_tiled_layout_is_bit_identical():
    """Every kernel reads the tile-contiguous bytes (tiles.py) exactly as it reads the row-major ones:
    same outputs bit for bit, for every decode and Triton tile (BK 64 to 256, 8-token to 256-row
    blocks; the per-element dequant, deq=1, refuses tiled bytes), ragged routing; the backend's own
    prepare tiles on sm90 and matches the twin."""
    from nvfp4stack.kernels.base import MoeWeights, load_backends
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import (
        CANDIDATES,
        DECODE_CANDIDATES,
        decode_available,
        nvfp4_moe_forward_triton,
        pick_config,
        pick_decode,
    )

    g = _gen("cuda")
    hidden, inter = 1024, 512  # 8 K steps of 128 in L1, 4 in L2; 77 tokens x 6 slots, one hot expert
    x, w13, w2, wts, ids = _problem(g, experts=8, hidden=hidden, inter=inter, tokens=77, top_k=6)
    t13, t2 = tiles.tile_experts(w13, w2)
    decode = decode_available(x.device)
    cfgs = tuple(c for c in CANDIDATES if c[0].deq != 1) + tuple(pick_config(r) for r in (1, 32, 100, 1000))
    if decode:
        picked = [pick_decode(r, hidden, inter, x.device) for r in (1, 4, 8, 16, 32)]
        cfgs += tuple(c for c in DECODE_CANDIDATES + tuple(p for p in picked if p)
                      if c[0].fits(hidden, inter) and c[1].fits(hidden, inter))
    failures = []
    for cfg in cfgs:
        rows = nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=LIMIT, config=cfg, poison=True)
        tiled = nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=LIMIT, config=cfg, poison=True,
                                         tiled=True)
        if not (torch.isfinite(rows).all() and torch.equal(rows, tiled)):
            failures.append(f"{cfg}: max |diff| {(rows.float() - tiled.float()).abs().max().item():.3e}")
    assert not failures, "\n".join(failures)
    per_element = next(c for c in CANDIDATES if c[0].deq == 1)
    with pytest.raises(ValueError, match=r"deq=1.*tiled=False"):
        nvfp4_moe_forward_triton(x, t13, t2, wts, ids, config=per_element, tiled=True)
    xs, s13, s2, swts, sids = _problem(g, experts=4, hidden=256, inter=192, tokens=4, top_k=2)  # w2 K = 192
    with pytest.raises(ValueError, match=r"w2: \[E, N, K\] = \[4, 256, 192\].*tiled=False"):
        nvfp4_moe_forward_triton(xs, s13, s2, swts, sids, tiled=True)
    load_backends()
    prepared = MOE_BACKENDS.get("triton_w4a16").prepare(MoeWeights(w13, w2))
    assert prepared.tiled == decode and (not decode or torch.equal(prepared.weights.w13.data, t13.data))
    _check(x, w13, w2, wts, ids, label="tiled via prepare")
