"""GPU host: the pure-read ceiling and the one-token pick / no-dequant variant timed with a READ flush (the L2 left
holding clean lines) beside the usual zeroing flush (dirty lines), to see what the flush's write-backs do to the
figures. argv[1]: variant for the pick (pick|none). Same difference-of-graphs method as cold_l2.cold_time_us."""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, "scratch/floor")
import deq_variants

deq_variants.apply(sys.argv[1])
import torch
from stream_ceiling_lib import stream

from nvfp4stack.bench.cold_l2 import flush_buffer
from nvfp4stack.bench.moe_few_tokens import call_inputs, expert_bytes, hbm_peak_tbs
from nvfp4stack.bench.moe_kernel import random_tiled_experts
from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm

dev = torch.device("cuda")
buf = flush_buffer(dev)
buf.random_(-2**30, 2**30)
sink = torch.empty((), dtype=torch.int64, device=dev)
flushes = {"zero": lambda: buf.zero_(), "read": lambda: torch.sum(buf, 0, out=sink)}
peak = hbm_peak_tbs(torch.cuda.get_device_name())


def timed(fn, flush, n=20, rounds=5):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    gb, gf = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(gb):
        for _ in range(n):
            flush(); fn()
    with torch.cuda.graph(gf):
        for _ in range(n):
            flush()
    res = []
    for _ in range(rounds):
        ts = []
        for g in (gb, gf):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            g.replay(); a.record(); g.replay(); b.record(); torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        res.append((ts[0] - ts[1]) / n * 1e3)
    return sorted(res)[len(res) // 2]


l1_bytes, l2_bytes = 6 * 2 * 2048 * 4096 * 9 // 16, 6 * 4096 * 2048 * 9 // 16
a = torch.randint(-2**31, 2**31 - 1, (l1_bytes // 4,), dtype=torch.int32, device=dev)
b = torch.randint(-2**31, 2**31 - 1, (l2_bytes // 4,), dtype=torch.int32, device=dev)
both = torch.cat([a, b])
out = torch.empty(132 * 64, dtype=torch.int32, device=dev)
g = 132 * 16
one = lambda: stream[(g,)](both, out, both.numel(), BLOCK=4096, UNROLL=1, num_warps=8)
two = lambda: (stream[(g,)](a, out, a.numel(), BLOCK=4096, UNROLL=1, num_warps=8),
               stream[(g,)](b, out, b.numel(), BLOCK=4096, UNROLL=1, num_warps=8))
gen = torch.Generator(device=dev).manual_seed(0)
t13, t2 = random_tiled_experts(256, 4096, 2048, dev, gen)
ids, wts, x = call_inputs(1, 256, 6, 4096, "uniform", gen, dev)
moe = lambda: fm.nvfp4_moe_forward_triton(x, t13, t2, wts, ids, swiglu_limit=10.0, tiled=True)
nb = {"read one launch": both.numel() * 4, "read two launches": both.numel() * 4,
      f"moe {sys.argv[1]}": 6 * expert_bytes(t13, t2)}
for rep in range(2):
    for fl, flush in flushes.items():
        for name, fn in (("read one launch", one), ("read two launches", two), (f"moe {sys.argv[1]}", moe)):
            ts = sorted(timed(fn, flush) for _ in range(3))
            print(f"ROW flush={fl} {name}: {ts[1]:.1f} us [{ts[0]:.1f}-{ts[2]:.1f}] "
                  f"{100 * nb[name] / ts[1] / 1e6 / peak:.0f}%HBM", flush=True)
