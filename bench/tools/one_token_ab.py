"""Device script (not a pytest module): a decode switch of fused_moe on against off, interleaved. ``--flag
one_token`` (the default): the one-token path (fused_moe.ONE_TOKEN: no routing launch, the top-k sum inside L2)
against the general path (align_routing, L1, L2, topk_sum_kernel). ``--flag pdl``: the mma.sync decode kernels
by programmatic dependent launch (fused_moe.PDL: L2 starts in L1's tail, the top-k sum in L2's) against plain
launches, at ``--tokens`` tokens (default 1,2,4,8).

For each shape and routing, both paths are timed in ROUNDS rounds in turn (cold L2, CUDA-graph replay:
nvfp4stack.bench.cold_l2), the heuristic's tiles (split-K as fill_split picks), tiled weights as the backend
prepares them on sm90; the line gives each path's median and range, the speed-up, the share of the H200's
4.8 TB/s the switched-on path reaches (bytes of the active experts' NVFP4 weights and scales, each once), and whether the
two outputs are equal bit for bit (they must be). Routings: uniform (distinct experts), and EP (the expert ids
of twice the experts, those of the other rank -1: about half the slots here, routed_experts set).

Usage (repo root, GPU host): python3 bench/tools/one_token_ab.py [--rounds 5] [--flag pdl --tokens 1,2,4,8]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())

# (name, (hidden, inter), experts): Flash and Pro, whole and per rank at tensor parallel 2
SHAPES = [("flash", (4096, 2048), 256), ("flash", (4096, 2048), 64), ("flash_tp2", (4096, 1024), 256),
          ("pro", (7168, 3072), 48), ("pro_tp2", (7168, 1536), 48)]
HBM_TBS = 4.8


def main() -> int:
    from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
    from nvfp4stack.bench.moe_kernel import random_tiled_experts
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--flag", choices=("one_token", "pdl"), default="one_token")
    p.add_argument("--tokens", default="", help="comma-separated token counts (default: 1, or 1,2,4,8 for pdl)")
    a = p.parse_args()
    flag = {"one_token": "ONE_TOKEN", "pdl": "PDL"}[a.flag]
    counts = [int(t) for t in (a.tokens or ("1" if a.flag == "one_token" else "1,2,4,8")).split(",")]
    on_name, off_name = ("one-token", "general") if a.flag == "one_token" else ("pdl", "plain")
    if a.flag == "one_token" and counts != [1]:
        p.error(f"--tokens: the one-token path runs at one token only, found {a.tokens}; drop --tokens")
    if not torch.cuda.is_available():
        print("one_token_ab: needs a CUDA GPU (sm90: the Gluon decode kernels); nothing run")
        return 2
    dev = torch.device("cuda")
    flush = flush_buffer(dev)
    print(torch.cuda.get_device_name(), torch.__version__, f"rounds {a.rounds}, {flag} on against off")
    for shape, (hidden, inter), experts in SHAPES:
        g = torch.Generator(device=dev).manual_seed(0)
        t13, t2 = random_tiled_experts(experts, hidden, inter, dev, g)
        expert_bytes = 3 * hidden * inter * (0.5 + 1 / 16)  # w13 and w2 codes, one e4m3 scale per 16
        for tokens, kind in ((t, k) for t in counts for k in ("uniform", "ep")):
            ids = torch.stack([torch.randperm(experts, device=dev, generator=g)[:6] for _ in range(tokens)])
            ids = ids.to(torch.int32)
            routed = 0
            if kind == "ep":  # as the engine passes them: global ids of 2x experts, the other rank's as -1
                ids = torch.where(torch.rand(ids.shape, device=dev, generator=g) < 0.5, -1, ids)
                routed = 2 * experts
            wts = torch.softmax(torch.randn(tokens, 6, device=dev, generator=g), -1)
            x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16, generator=g)
            run = lambda: fm.nvfp4_moe_forward_triton(  # noqa: E731
                x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True, routed_experts=routed)
            outs, times = {}, {True: [], False: []}
            for _ in range(a.rounds):  # interleaved: on, off, on, ...
                for on in (True, False):
                    setattr(fm, flag, on)
                    outs[on] = run()
                    times[on].append(cold_time_us(run, flush))
            setattr(fm, flag, True)
            med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            # the forward's own choice of tiles for this load, and whether the switch acts on it (on other tiles both
            # variants run the same code: a control row)
            cfg1 = fm.pick_call(fm.routed_rows_per_expert(tokens, 6, experts, routed), tokens * 6, experts, hidden,
                                inter, fm.decode_available(dev), fm.sm_count(dev))[0]
            used = fm.one_token_path(tokens, cfg1) if a.flag == "one_token" else fm.pdl_path(cfg1)
            switch = f"{'switch used' if used else 'switch not used (a control)'} on {cfg1}"
            live = int((ids >= 0).sum())
            active = int(torch.unique(ids[ids >= 0]).numel())  # the experts whose weights are read once each
            hbm = active * expert_bytes / (med[True] * 1e-6) / (HBM_TBS * 1e12) * 100
            print(f"{shape:9s} E={experts:3d} T={tokens} {kind:7s} slots={live} experts={active} | "
                  f"{on_name} {med[True]:6.1f} "
                  f"[{min(times[True]):.1f}-{max(times[True]):.1f}] us | {off_name} {med[False]:6.1f} "
                  f"[{min(times[False]):.1f}-{max(times[False]):.1f}] us | {med[False] / med[True]:.2f}x | "
                  f"{hbm:.0f}% of HBM | equal bits: {torch.equal(outs[True], outs[False])} | {switch}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
