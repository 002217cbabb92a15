# Run at git 07ad451 (the TMA ring removed after it), repo root on a GPU host: PYTHONPATH=$PWD python3 THIS
"""A/B at 1-4 tokens: the register pick against TMA rings, 64- and 256-byte TMA lines (cold L2, interleaved rounds)."""
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.getcwd())
from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
from nvfp4stack.bench.moe_few_tokens import call_inputs
from nvfp4stack.bench.moe_kernel import random_tiled_experts
from nvfp4stack.kernels.moe.hopper_w4a16 import _decode_tma as dt
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm
from nvfp4stack.kernels.moe.hopper_w4a16 import tile_choice as tc

dev = torch.device("cuda")
flush = flush_buffer(dev)
sms = fm.sm_count(dev)
l1, l2 = tc._DECODE_FEW
ROUNDS = int(os.environ.get("ROUNDS", "5"))
for shape, (hidden, inter), experts, counts in (("flash", (4096, 2048), 256, (1, 2, 4)), ("pro", (7168, 3072), 48, (1,))):
    g = torch.Generator(device=dev).manual_seed(0)
    t13, t2 = random_tiled_experts(experts, hidden, inter, dev, g)
    for t in counts:
        ids, wts, x = call_inputs(t, experts, 6, hidden, "uniform", g, dev)
        def tma(w1, m2, slots, split=None):
            p = (replace(l1, num_warps=w1, tma=slots), replace(l2, mrep=m2, prefetch=0, tma=slots))
            if split:
                return tuple(replace(c, split_k=s) for c, s in zip(p, split))
            return tc.fill_split(p, t * 6, experts, hidden, inter, sms)
        variants = {"pick": (None, 64)}
        for lb in (64, 256):
            variants[f"t4/{lb}"] = (tma(8, 2, 4), lb)
            variants[f"t2n/{lb}"] = (tma(4, 1, 2), lb)
            variants[f"t3n2/{lb}"] = (tma(4, 1, 3, (2, 2)), lb)
        def run(name):
            cfg, lb = variants[name]
            dt.LINE_BYTES = lb
            return fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, config=cfg, tiled=True)
        ref = run("pick").float()
        diff = {n: float((run(n).float() - ref).norm() / ref.norm()) for n in variants}
        times = {n: [] for n in variants}
        for _ in range(ROUNDS):
            for n in variants:
                cfg, lb = variants[n]
                dt.LINE_BYTES = lb
                times[n].append(cold_time_us(lambda: run(n), flush))
        active = int(torch.unique(ids).numel())
        nbytes = active * 3 * hidden * inter * (1 / 2 + 1 / 16)
        med = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
        print(f"{shape}{experts} T={t}: " + " | ".join(
            f"{n} {med[n]:.1f} [{min(times[n]):.1f}-{max(times[n]):.1f}] {100 * nbytes / med[n] / 1e6 / 4.8:.0f}% "
            f"{med['pick'] / med[n]:.2f}x d={diff[n]:.0e}" for n in variants), flush=True)
