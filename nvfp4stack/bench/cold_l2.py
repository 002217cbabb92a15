"""Timing with a cold L2: the cache is flushed before every call, on every side of a comparison.

Decode reads each expert's weights once per step, and a real step finds them in HBM, not in the
L2 a tight benchmark loop leaves warm (50-60 MB on H100/H200 holds a few experts). One CUDA graph
replays (flush, call) ``n`` times and another (flush) ``n`` times; their difference over ``n`` is the
call's time, launch gaps removed as in vLLM's graph replay.
"""
from __future__ import annotations

import torch


def flush_buffer(device=None) -> torch.Tensor:
    """A buffer four times the device's L2; zeroing it evicts whatever the L2 held."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.empty(l2, dtype=torch.int32, device=device)


def cold_time_us(fn, flush: torch.Tensor, n: int = 20, rounds: int = 5) -> float:
    """Median over ``rounds`` of (graph[flush, fn] x n - graph[flush] x n) / n, in microseconds."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compilation, allocator) outside the graphs
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g_both, g_flush = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_both):
        for _ in range(n):
            flush.zero_()
            fn()
    with torch.cuda.graph(g_flush):
        for _ in range(n):
            flush.zero_()
    res = []
    for _ in range(rounds):
        ts = []
        for g in (g_both, g_flush):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            g.replay()
            a.record()
            g.replay()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        res.append((ts[0] - ts[1]) / n * 1e3)
    return sorted(res)[len(res) // 2]
