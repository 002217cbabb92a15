"""Timing with a cold L2: the cache is flushed before every call, on every side of a comparison.

Decode reads each expert's weights once per step, and a real step finds them in HBM, not in the
L2 a tight benchmark loop leaves warm (50-60 MB on H100/H200 holds a few experts). One CUDA graph
replays (flush, call) ``n`` times and another (flush) ``n`` times; their difference over ``n`` is the
call's time, launch gaps removed as in vLLM's graph replay.

The flush reads a buffer four times the L2 (a sum into one element), which leaves the L2
holding that buffer's lines, all clean: what a decode step's MoE finds after the attention and dense
layers before it, which read their weights and KV cache and write little. Until 2026-11-29 the flush
zeroed the buffer instead (``dirty=True`` keeps that way): it evicts as well, but leaves the L2 full of
dirty lines, whose write-back to HBM then shares the timed call's bandwidth. On an H200 that added
6-7 us to a streaming read of a one-token Flash layer's 84.9 MB (27.3 us against 20.5) and 6 us to
our one-token MoE (43.4 against 37.5 us), bench/RESULTS.md "the one-token floor and ceiling".
"""
from __future__ import annotations

import torch


def flush_buffer(device=None) -> torch.Tensor:
    """A buffer four times the device's L2 (int32 elements as many as the L2 has bytes)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return torch.zeros(l2, dtype=torch.int32, device=device)


def evict(flush: torch.Tensor, sink: torch.Tensor, dirty: bool = False) -> None:
    """Push whatever the L2 holds out with ``flush``'s lines: read them (their sum as float32 into ``sink``, a
    float32 scalar: torch's float reduction streams at HBM speed, its int64 one about 8x slower; the buffer is
    left as it was), or with ``dirty`` write zeros over them (the L2 left dirty)."""
    if dirty:
        flush.zero_()
    else:
        torch.sum(flush.view(torch.float32), 0, out=sink)


def cold_time_us(fn, flush: torch.Tensor, n: int = 20, rounds: int = 5, dirty: bool = False) -> float:
    """Median over ``rounds`` of (graph[evict, fn] x n - graph[evict] x n) / n, in microseconds (``dirty``: the
    zeroing flush, see the module docstring)."""
    sink = torch.zeros((), dtype=torch.float32, device=flush.device)
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
            evict(flush, sink, dirty)
            fn()
    with torch.cuda.graph(g_flush):
        for _ in range(n):
            evict(flush, sink, dirty)
    res = []
    for _ in range(rounds):
        res.append((replay_ms(g_both) - replay_ms(g_flush)) / n * 1e3)
    return sorted(res)[len(res) // 2]


def replay_ms(graph: torch.cuda.CUDAGraph) -> float:
    """Milliseconds one replay of ``graph`` takes, timed by CUDA events after one replay that is not timed."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    a.record()
    graph.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)
