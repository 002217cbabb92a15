"""Device script (not a pytest module): the decode heuristic's pick against named alternative pairs, interleaved,
at a few tokens (1-16) where the 8-token mma.sync pair and the 16-token wgmma ring are close.

For each shape, routing (uniform, Zipf-1.1) and token count, the pick (``fused_moe.nvfp4_moe_forward_triton`` with
no override: ``pick_call``, split-K as ``fill_split`` chooses) and every alternative are timed in ``--rounds``
rounds in turn (cold L2, CUDA-graph replay: nvfp4stack.bench.cold_l2), tiled weights as the backend prepares them on
sm90. A line gives each pair's median, range and speed-up over the pick, and each alternative's relative
difference to the pick's output (split-K and the ring sum in another order: about 1e-3, never more than 1e-2), and
each pair's share of HBM: the routed experts' packed weights and scales over its median time, against the GPU's
nominal bandwidth (moe_few_tokens.HBM_PEAK_TBS).
Alternatives:
  ring   the 16-token wgmma ring (tile_choice._DECODE_T16_RING), as the heuristic runs from 0.5 rows;
  p1     the 8-token pair (_DECODE_FEW) with L2 at prefetch 1 (its activations loaded where they are used: the
         pair until 2026-11-28), split as fill_split picks;
  p2     the same pair with L2 at prefetch 2 (the next step's activations loaded with its weights: the pick from
         2026-11-28; since 2026-11-29 the pick's L1 is l1p1r80's where its launch fits 3 CTAs an SM);
  s2p2   the prefetch-2 pair split in 2 K runs, whatever fill_split would pick;
  l1p1   the prefetch-2 pair with L1's next K step's weights prefetched too (L1 prefetch 1; more registers: fewer
         programs an SM), split as fill_split picks;
  l1p2   the same with L1 at prefetch 2 (its activations too);
  l2m1, l2w8, l2w2   the prefetch-2 pair (p2, its splits) with L2's rows over 4 warps x 1 m-tile (64 rows), 8 x 1
         (128) or 2 x 2 (64): the same bits, other grids and warps an SM;
  l1w4, l1m2   the same with L1's over 4 warps x 1 m-tile (64 rows) or 4 x 2 (128);
  l1k128p1, l1p1r80, l1k128p2r80   the prefetch-2 pair with L1's next K step in registers at a size that keeps its
         one-token grid resident (3+ CTAs an SM): BK 128 at prefetch 1 (57 registers, Triton 3.6), BK 256 at prefetch 1
         capped at 80 registers (no spill), BK 128 at prefetch 2 capped at 80; split as fill_split picks.

Usage (repo root, GPU host): python3 bench/tools/decode_pick_ab.py [--rounds 3] [--runs full|tp2|few|all]
[--only p1,ring]  (few: Flash 256 at 1, 2 and 4 tokens, Flash 64 and Pro 48 at 1 and 2)
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.getcwd())

RUNS = {
    "full": [("flash", (4096, 2048), 256, (1, 2, 3, 4, 6, 8, 12, 16)), ("flash", (4096, 2048), 64, (1, 2, 3, 4)),
             ("pro", (7168, 3072), 48, (1, 2, 3))],
    "tp2": [("flash_tp2", (4096, 1024), 256, (1, 2, 4, 8)), ("pro_tp2", (7168, 1536), 48, (1, 2, 3))],
}
RUNS["all"] = RUNS["full"] + RUNS["tp2"]
RUNS["few"] = [("flash", (4096, 2048), 256, (1, 2, 4)), ("flash", (4096, 2048), 64, (1, 2)),
               ("pro", (7168, 3072), 48, (1, 2))]

# L2 tiles of other shapes (same block_k, prefetch and split: the same bits): name -> (warps, m-tiles a warp)
L2_TILES = {"l2m1": (4, 1), "l2w8": (8, 1), "l2w2": (2, 2)}
L1_TILES = {"l1w4": (4, 1), "l1m2": (4, 2)}  # the same for L1
# L1 with its next K step prefetched at a register count whose CTAs fit 3 or more an SM: name -> DecodeConfig fields
L1_PREFETCH = {"l1k128p1": dict(block_k=128, prefetch=1), "l1p1r80": dict(prefetch=1, maxnreg=80),
               "l1k128p2r80": dict(block_k=128, prefetch=2, maxnreg=80)}


def alternatives(top_k: int, tokens: int, experts: int, hidden: int, inter: int, sms: int) -> dict:
    """The named alternative (L1, L2) pairs of the module docstring for one load (those that fit the shape)."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import tile_choice as tc

    l1, l2 = tc._DECODE_FEW
    l2p2 = replace(l2, prefetch=2)
    alts = {"ring": tc._DECODE_T16_RING,
            "p1": tc.fill_split((l1, replace(l2, prefetch=1)), tokens * top_k, experts, hidden, inter, sms),
            "p2": tc.fill_split((l1, l2p2), tokens * top_k, experts, hidden, inter, sms),
            "s2p2": (replace(l1, split_k=2), replace(l2p2, split_k=2)),
            "l1p1": tc.fill_split((replace(l1, prefetch=1), l2p2), tokens * top_k, experts, hidden, inter, sms),
            "l1p2": tc.fill_split((replace(l1, prefetch=2), l2p2), tokens * top_k, experts, hidden, inter, sms)}
    p2 = alts["p2"]
    for name, (w2, m2) in L2_TILES.items():  # the pick's pair and splits, L2's rows over other warps and m-tiles
        alts[name] = (p2[0], replace(p2[1], num_warps=w2, mrep=m2))
    for name, (w1, m1) in L1_TILES.items():
        alts[name] = (replace(p2[0], num_warps=w1, mrep=m1), p2[1])
    for name, fields in L1_PREFETCH.items():
        alts[name] = tc.fill_split((replace(l1, **fields), l2p2), tokens * top_k, experts, hidden, inter, sms)
    return {n: p for n, p in alts.items() if all(c.fits(hidden, inter) for c in p)}


def main() -> int:
    from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
    from nvfp4stack.bench.moe_few_tokens import call_inputs, expert_bytes, hbm_peak_tbs
    from nvfp4stack.bench.moe_kernel import random_tiled_experts
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", choices=sorted(RUNS), default="all")
    p.add_argument("--only", default="", help="comma-separated alternatives to time beside the pick (default: all)")
    a = p.parse_args()
    only = set(filter(None, a.only.split(",")))
    known = set(alternatives(6, 1, 256, 4096, 2048, 132))   # every name (all fit Flash at one token)
    if only - known:
        p.error(f"--only: expected names among {','.join(sorted(known))}, found {','.join(sorted(only - known))}; "
                f"fix: --only {','.join(sorted(only & known)) or 'p1'}")
    if not torch.cuda.is_available():
        print("decode_pick_ab: needs a CUDA GPU (sm90: the Gluon decode kernels); nothing run")
        return 2
    dev = torch.device("cuda")
    flush = flush_buffer(dev)
    sms = fm.sm_count(dev)
    top_k = 6
    peak = hbm_peak_tbs(torch.cuda.get_device_name()) or float("nan")
    print(torch.cuda.get_device_name(), torch.__version__, f"rounds {a.rounds}", flush=True)
    for shape, (hidden, inter), experts, counts in RUNS[a.runs]:
        g = torch.Generator(device=dev).manual_seed(0)
        t13, t2 = random_tiled_experts(experts, hidden, inter, dev, g)
        per_expert = expert_bytes(t13, t2)
        for kind in ("uniform", "zipf"):
            for t in counts:
                ids, wts, x = call_inputs(t, experts, top_k, hidden, kind, g, dev)
                pairs = {"pick": None, **{n: p for n, p in alternatives(top_k, t, experts, hidden, inter, sms).items()
                                          if not only or n in only}}
                runs = {n: (lambda c=c: fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0,
                                                                      config=c, tiled=True)) for n, c in pairs.items()}
                ref = runs["pick"]().float()
                diff = {n: float((f().float() - ref).norm() / ref.norm()) for n, f in runs.items() if n != "pick"}
                times = {n: [] for n in runs}
                for _ in range(a.rounds):  # interleaved: pick, ring, ..., pick, ring, ...
                    for n, f in runs.items():
                        times[n].append(cold_time_us(f, flush))
                med = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
                picked = fm.pick_call(fm.routed_rows_per_expert(t, top_k, experts), t * top_k, experts, hidden, inter,
                                      fm.decode_available(dev), sms)
                label = "ring" if picked[0].wgmma else f"pair s{picked[0].split_k}s{picked[1].split_k}"
                nbytes = int(torch.unique(ids).numel()) * per_expert
                cells = " | ".join(f"{n} {med[n]:6.1f} [{min(times[n]):.1f}-{max(times[n]):.1f}] "
                                   f"{100 * nbytes / med[n] / 1e6 / peak:.0f}%HBM"
                                   + ("" if n == "pick" else f" {med['pick'] / med[n]:.2f}x d={diff[n]:.0e}")
                                   for n in runs)
                print(f"{shape}{experts} {kind:7s} T={t:2d} rows/exp={t * top_k / experts:.3f} pick={label} | {cells}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
