"""GPU host: the decode pick's time at the 'few' loads with a diagnostic dequant variant (argv[1]; see
deq_variants.py). Cold L2, CUDA-graph replay, as decode_pick_ab.py. WRONG numbers for noscale/none: timing only."""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, "scratch/floor")
import deq_variants

variant, rounds = sys.argv[1], int(sys.argv[2])
deq_variants.apply(variant)

import torch

from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
from nvfp4stack.bench.moe_few_tokens import call_inputs, expert_bytes, hbm_peak_tbs
from nvfp4stack.bench.moe_kernel import random_tiled_experts
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

RUNS = [("flash", (4096, 2048), 256, (1, 2, 4)), ("flash", (4096, 2048), 64, (1, 2)), ("pro", (7168, 3072), 48, (1, 2))]
dev = torch.device("cuda")
flush = flush_buffer(dev)
peak = hbm_peak_tbs(torch.cuda.get_device_name())
top_k = 6
for shape, (hidden, inter), experts, counts in RUNS:
    g = torch.Generator(device=dev).manual_seed(0)
    t13, t2 = random_tiled_experts(experts, hidden, inter, dev, g)
    per_expert = expert_bytes(t13, t2)
    for kind in ("uniform", "zipf"):
        for t in counts:
            ids, wts, x = call_inputs(t, experts, top_k, hidden, kind, g, dev)
            f = lambda: fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True)
            f()
            times = sorted(cold_time_us(f, flush) for _ in range(rounds))
            med = times[len(times) // 2]
            nbytes = int(torch.unique(ids).numel()) * per_expert
            print(f"ROW {variant} {shape}{experts} {kind} T={t} {med:.1f} [{times[0]:.1f}-{times[-1]:.1f}] "
                  f"{100 * nbytes / med / 1e6 / peak:.0f}%HBM", flush=True)
