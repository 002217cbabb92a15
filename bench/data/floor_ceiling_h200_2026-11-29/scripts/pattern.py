"""GPU host: does the order in which CTAs read their bytes matter? The one-token L1's 56.6 MB read by 384 or 192
programs of 8 warps, each owning a contiguous region (as a decode CTA owns its row block's K run), 16 KB a step, all
programs starting at their region's first step (as the decode kernels do) or at a step rotated by the program id;
against the grid-stride read. Cold L2 (read flush), CUDA graphs, median of 3."""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
import triton
import triton.language as tl

from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
from nvfp4stack.bench.moe_few_tokens import hbm_peak_tbs


@triton.jit
def blocked(src, out, words_per_prog, CHUNK: tl.constexpr, ROT: tl.constexpr, UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * words_per_prog
    n = words_per_prog // (CHUNK * UNROLL)
    offs = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], tl.int32)
    for i in range(n):
        j = i
        if ROT:
            j = (i + pid) % n
        for u in tl.static_range(UNROLL):
            acc ^= tl.load(src + base + (j * UNROLL + u) * CHUNK + offs)
    tl.store(out + pid, tl.sum(acc, 0))


@triton.jit
def strided(src, out, n_words, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.int32)
    offs = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK, n_words, nprog * BLOCK):
        o = start + offs
        acc ^= tl.load(src + o, mask=o < n_words, other=0)
    tl.store(out + pid, tl.sum(acc, 0))


dev = torch.device("cuda")
flush = flush_buffer(dev)
peak = hbm_peak_tbs(torch.cuda.get_device_name())
nbytes = 384 * 147456  # 56.6 MB: 384 regions of 144 KB (9 steps of 16 KB)
a = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=dev)
out = torch.empty(132 * 64, dtype=torch.int32, device=dev)
cases = {"grid-stride 16/SM": lambda: strided[(132 * 16,)](a, out, a.numel(), BLOCK=4096, num_warps=8)}
for progs in (384, 192):
    wpp = a.numel() // progs
    for rot in (0, 1):
        for unroll in (1, 2):
            chunk = 4096 // unroll if progs == 384 else 4096
            if wpp % (chunk * unroll):
                continue
            cases[f"{progs} regions, {4 * chunk * unroll // 1024} KB a step ({unroll} loads), "
                  f"{'rotated' if rot else 'in order'}"] = (
                lambda w=wpp, c=chunk, r=rot, u=unroll, p=progs: blocked[(p,)](a, out, w, CHUNK=c, ROT=r, UNROLL=u,
                                                                          num_warps=8))
for rep in range(2):
    for name, fn in cases.items():
        ts = sorted(cold_time_us(fn, flush) for _ in range(3))
        print(f"ROW {name}: {ts[1]:.1f} us [{ts[0]:.1f}-{ts[2]:.1f}] {100 * nbytes / ts[1] / 1e6 / peak:.0f}%HBM",
              flush=True)
