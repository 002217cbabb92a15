"""GPU host: how fast can one H200 read the bytes of a one-token Flash 256 MoE layer (6 experts: w13 56.6 MB and
w2 28.3 MB of codes + scales) from cold L2, with no math at all? A Triton streaming read (16-byte loads, each program
sums its chunks into one int so nothing is dead code), in one launch over 84.9 MB or two (L1's bytes, then L2's),
timed as decode_pick_ab times (cold L2, CUDA graphs). Grid and unroll swept."""
import os
import sys

sys.path.insert(0, os.getcwd())
import triton
import triton.language as tl


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


