"""GPU host: how fast can one H200 read the bytes of a one-token Flash 256 MoE layer (6 experts: w13 56.6 MB and
w2 28.3 MB of codes + scales) from cold L2, with no math at all? A Triton streaming read (16-byte loads, each program
sums its chunks into one int so nothing is dead code), in one launch over 84.9 MB or two (L1's bytes, then L2's),
timed as decode_pick_ab times (cold L2, CUDA graphs). Grid and unroll swept."""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
import triton
import triton.language as tl

from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
from nvfp4stack.bench.moe_few_tokens import hbm_peak_tbs


@triton.jit
def stream(src, out, n_words, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.int32)
    offs = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK * UNROLL, n_words, nprog * BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            o = start + u * BLOCK + offs
            acc ^= tl.load(src + o, mask=o < n_words, other=0)
    tl.store(out + pid, tl.sum(acc, 0))


dev = torch.device("cuda")
flush = flush_buffer(dev)
peak = hbm_peak_tbs(torch.cuda.get_device_name())
l1_bytes, l2_bytes = 6 * 2 * 2048 * 4096 * 9 // 16, 6 * 4096 * 2048 * 9 // 16
a = torch.randint(-2**31, 2**31 - 1, (l1_bytes // 4,), dtype=torch.int32, device=dev)
b = torch.randint(-2**31, 2**31 - 1, (l2_bytes // 4,), dtype=torch.int32, device=dev)
both = torch.cat([a, b])
out = torch.empty(132 * 64, dtype=torch.int32, device=dev)
res = []
for progs_per_sm in (1, 2, 4, 8, 16):
    for block, unroll, warps in ((1024, 1, 4), (1024, 4, 4), (2048, 2, 8), (4096, 1, 8)):
        g = 132 * progs_per_sm
        one = lambda: stream[(g,)](both, out, both.numel(), BLOCK=block, UNROLL=unroll, num_warps=warps)
        two = lambda: (stream[(g,)](a, out, a.numel(), BLOCK=block, UNROLL=unroll, num_warps=warps),
                       stream[(g,)](b, out, b.numel(), BLOCK=block, UNROLL=unroll, num_warps=warps))
        t1 = sorted(cold_time_us(one, flush) for _ in range(3))
        t2 = sorted(cold_time_us(two, flush) for _ in range(3))
        nb = both.numel() * 4
        line = (f"progs/SM {progs_per_sm:2d} block {block} unroll {unroll} warps {warps}: one launch {t1[1]:.1f} us "
                f"[{t1[0]:.1f}-{t1[2]:.1f}] {100 * nb / t1[1] / 1e6 / peak:.0f}%HBM | two launches {t2[1]:.1f} us "
                f"[{t2[0]:.1f}-{t2[2]:.1f}] {100 * nb / t2[1] / 1e6 / peak:.0f}%HBM")
        print(line, flush=True)
        res.append((t1[1], line))
print("best one launch:", min(res)[1])
