"""Device script (not a pytest module): the split-K decode pairs against the unsplit pair, interleaved.

For each shape, routing (uniform, Zipf-1.1) and token count, every pair is timed in 3 rounds in turn
(cold L2, CUDA-graph replay: nvfp4stack.bench.cold_l2), and the line gives each pair's median, range and
speed-up over the unsplit pair, with the split fill_split picks for that load (``pick=s<L1>s<L2>``).
Figures behind tile_choice.FILL_CTAS_PER_SM (bench/RESULTS.md, "split-K for one-token decode").

Usage (repo root, GPU host): python3 bench/tools/split_k_ab.py [--runs full|tp2]
  full: Flash (4096 x 2048) at 256 and 64 experts, Pro (7168 x 3072) at 48;
  tp2:  the same models' per-rank shapes at tensor parallel 2 (I 1024 and 1536).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())

RUNS = {
    "full": [("flash", (4096, 2048), 256, (1, 2, 3, 4, 6, 8, 12, 16, 21)), ("flash", (4096, 2048), 64, (1, 2, 4)),
             ("pro", (7168, 3072), 48, (1, 2, 3))],
    "tp2": [("flash_tp2", (4096, 1024), 256, (1, 2, 3, 4, 6, 8)), ("pro_tp2", (7168, 1536), 48, (1, 2, 3))],
}


def main() -> int:
    from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
    from nvfp4stack.bench.moe_few_tokens import call_inputs
    from nvfp4stack.bench.moe_kernel import random_tiled_experts
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import _DECODE_FEW
    from nvfp4stack.kernels.moe.hopper_w4a16.tile_choice import DecodeConfig as D

    p = argparse.ArgumentParser()
    p.add_argument("--runs", choices=sorted(RUNS), default="full")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("split_k_ab: needs a CUDA GPU (sm90: the Gluon decode kernels); nothing run")
        return 2
    l1, l2 = _DECODE_FEW
    pairs = {"base": (l1, l2)}
    for s1, s2 in ((2, 2), (1, 2), (2, 1), (4, 2), (4, 1), (4, 4)):
        pairs[f"s{s1}s{s2}"] = (D(8, 1, 256, 8, 0, split_k=s1), D(8, 2, 128, 4, 1, split_k=s2))
    dev = torch.device("cuda")
    flush = flush_buffer(dev)
    print(torch.cuda.get_device_name(), torch.__version__)
    for shape, (hidden, inter), experts, tokens in RUNS[a.runs]:
        g = torch.Generator(device=dev).manual_seed(0)
        t13, t2 = random_tiled_experts(experts, hidden, inter, dev, g)
        for kind in ("uniform", "zipf"):
            for t in tokens:
                ids, wts, x = call_inputs(t, experts, 6, hidden, kind, g, dev)
                names = [n for n, c in pairs.items() if all(k.fits(hidden, inter) for k in c)]
                times = {n: [] for n in names}
                for _ in range(3):  # rounds interleaved: base, s2s2, ..., base, s2s2, ...
                    for n in names:
                        times[n].append(cold_time_us(lambda c=pairs[n]: fm.nvfp4_moe_forward_triton(
                            x, t13, t2, wts, ids, swiglu_limit=10.0, config=c, tiled=True), flush))
                med = {n: sorted(v)[1] for n, v in times.items()}
                pick = fm.fill_split((l1, l2), t * 6, experts, hidden, inter, fm.sm_count(dev))
                cells = " ".join(f"{n} {med[n]:6.1f} [{min(times[n]):.1f}-{max(times[n]):.1f}] "
                                 f"{med['base'] / med[n]:.2f}x" for n in names)
                print(f"{shape}{experts} {kind:7s} T={t:2d} rows/exp={t * 6 / experts:.3f} "
                      f"pick=s{pick[0].split_k}s{pick[1].split_k} | {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
