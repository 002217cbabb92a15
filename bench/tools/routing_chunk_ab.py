"""Device script (not a pytest module): the routing kernel's ids chunk (CH) at decode and prefill slot counts.

For each (experts, routed slots, block) the alignment kernel (``_routing_kernel.align_kernel``) runs at
every chunk in turn: 20 launches captured in one CUDA graph, replayed 10 times per round after a
256 MB write (cold L2 for the first launch), 5 rounds; the line gives the median per launch, the range
of the rounds, and whether the outputs equal the torch alignment's (``routing.align_by_expert``), bit
for bit. Figures behind routing_triton.chunk_slots (bench/RESULTS.md, "the routing kernel's chunk").

Usage (repo root, GPU host): PYTHONPATH=$PWD python3 bench/tools/routing_chunk_ab.py [--prefill]

--prefill: around routing_triton.MAX_SLOTS (past it the forward takes the torch alignment) at a 2k-token prefill's
12,288 slots and more, also under expert parallelism (128 local experts of 256: about half the ids -1), the kernel
at CH 1024 against the torch alignment (captured in the same kind of graph). The question for MAX_SLOTS.
"""
from __future__ import annotations

import statistics
import sys

import torch

LOADS = [(256, 6, 16), (256, 6, 64), (256, 48, 16), (256, 192, 16), (256, 768, 64), (256, 3072, 64),
         (256, 8190, 64), (64, 6, 16)]   # (experts, routed slots = tokens x top-6, block)
CHUNKS = (1024, 512, 256, 128)
# (local experts, routed slots, block, EP: top-6 over twice the experts, ids of the other half -1)
PREFILL_LOADS = [(256, 8190, 64, False), (256, 12288, 64, False), (128, 12288, 64, True), (256, 16384, 64, False),
                 (128, 24576, 64, True), (256, 32766, 64, False), (128, 32766, 64, True), (256, 49152, 64, False),
                 (256, 98304, 64, False)]


def routed_ids(experts: int, slots: int, device: str, ep: bool = False) -> torch.Tensor:
    """Top-6 choices of slots // 6 tokens (slots // 6 * 6 ids), six distinct experts a token, seed 0. ep: chosen among 2 x experts,
    those past ``experts`` (another rank's) -1, as moe_method.local_routing hands them over."""
    g = torch.Generator(device=device).manual_seed(0)
    among = 2 * experts if ep else experts
    ids = torch.stack([torch.randperm(among, device=device, generator=g)[:6]
                       for _ in range(slots // 6)]).to(torch.int32).reshape(-1)
    return torch.where(ids < experts, ids, torch.full_like(ids, -1)) if ep else ids


def time_chunk(launch, flush: torch.Tensor) -> list[float]:
    """Per-launch microseconds of 5 rounds (each the median of 10 replays of 20 launches)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            launch()
    rounds = []
    for _ in range(5):
        times = []
        for _ in range(10):
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1000 / 20)
        rounds.append(statistics.median(times))
    return rounds


def main() -> int:
    import triton

    from nvfp4stack.kernels.moe.hopper_w4a16._routing_kernel import align_kernel
    from nvfp4stack.kernels.moe.hopper_w4a16.routing import align_by_expert, max_padded_slots

    dev = "cuda"
    prefill = sys.argv[1:] == ["--prefill"]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for experts, slots, bm, ep in (PREFILL_LOADS if prefill else [(*load, False) for load in LOADS]):
        ids = routed_ids(experts, slots, dev, ep)
        slots = ids.numel()  # slots // 6 * 6: the kernel must be told the ids it has (16384 gave 16380 ids)
        ref = align_by_expert(ids.view(-1, 6), experts, bm)
        padded = max_padded_slots(slots, experts, bm)
        ep2 = max(16, 1 << (experts - 1).bit_length())
        cells = []
        if prefill:   # the torch alignment, as the forward runs it past MAX_SLOTS
            r = time_chunk(lambda: align_by_expert(ids.view(-1, 6), experts, bm), flush)
            cells.append(f"torch: {statistics.median(r):.2f} us [{min(r):.2f}-{max(r):.2f}]")
        for ch in ((1024,) if prefill else CHUNKS):
            s = torch.empty(padded, dtype=torch.int32, device=dev)
            e = torch.empty(padded // bm, dtype=torch.int32, device=dev)
            n = torch.empty(1, dtype=torch.int32, device=dev)

            def launch(ch=ch, s=s, e=e, n=n):
                align_kernel[(experts + 1,)](ids, slots, experts, s, s.numel(), e, e.numel(), n, s, s.numel(), e,
                                             e.numel(), n, EP2=ep2, BM=bm, CH=ch, FILL=1024, SPLIT=0, BM2=bm,
                                             num_warps=4)
            launch()
            torch.cuda.synchronize()
            same = (torch.equal(s, ref.sorted_ids) and torch.equal(e, ref.expert_ids)
                    and int(n) == int(ref.num_padded))
            r = time_chunk(launch, flush)
            cells.append(f"CH {ch}: {statistics.median(r):.2f} us [{min(r):.2f}-{max(r):.2f}] "
                         f"{'same bits' if same else 'MISMATCH'}")
        print(f"experts {experts} slots {slots}{' (EP, ' + str(int((ids >= 0).sum())) + ' local)' if ep else ''} "
              f"block {bm}: " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
