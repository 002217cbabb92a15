"""Device script (not a pytest module): the wgmma decode kernels' K-permuted copy of x, torch against Triton.

For each token count T (x [T, hidden] bf16, heavy-tailed values, as L1 reads it) and block_k, torch's strided
copy (``k_order.permute_k``) and the one Triton launch (``k_order_triton.permute_k_triton``) each run 20 times
in one CUDA graph, replayed 10 times per round (the median of the replays), 7 rounds alternating between the
two; the line gives each one's median per launch and the range of its rounds, their ratio, and whether the bytes
are equal. L2 is left warm, as in the forward, where x was just written by the layer's norm.

Usage (repo root, GPU host): PYTHONPATH=$PWD python3 bench/tools/permute_k_ab.py [--hidden 4096]
"""
from __future__ import annotations

import argparse
import statistics

import torch

TOKENS = (8, 32, 64, 128, 256, 512)
BLOCKS = (128, 256)


def graph_of(fn, x, bk):
    g = torch.cuda.CUDAGraph()
    fn(x, bk)  # compile outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn(x, bk)
    return g


def one_round(g) -> float:
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / 20)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("permute_k_ab: needs a CUDA GPU (CUDA graphs and CUDA events time the copies); nothing run")
        return 2
    from nvfp4stack.kernels.moe.hopper_w4a16.k_order import permute_k
    from nvfp4stack.kernels.moe.hopper_w4a16.k_order_triton import permute_k_triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | hidden {args.hidden}")
    print(f"{'T':>5} {'BK':>4} {'torch us (range)':>22} {'triton us (range)':>22} {'torch/triton':>12}  same bytes")
    for t in TOKENS:
        for bk in BLOCKS:
            x = torch.randn(t, args.hidden, device="cuda", generator=gen)
            x = (x * torch.exp(2 * torch.randn(t, args.hidden, device="cuda", generator=gen))).to(torch.bfloat16)
            same = torch.equal(permute_k(x, bk).view(torch.int16), permute_k_triton(x, bk).view(torch.int16))
            ga, gb = graph_of(permute_k, x, bk), graph_of(permute_k_triton, x, bk)
            ra, rb = [], []
            for _ in range(7):
                ra.append(one_round(ga))
                rb.append(one_round(gb))
            ma, mb = statistics.median(ra), statistics.median(rb)
            print(f"{t:5d} {bk:4d} {ma:8.2f} ({min(ra):5.2f}-{max(ra):5.2f}) {mb:8.2f} ({min(rb):5.2f}-{max(rb):5.2f}) "
                  f"{ma / mb:11.2f}x  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
