"""Device script (not a pytest module): issue #34's prefill under expert parallelism, at the MoE alone.

At TP=2 + EP on two H200s (bench/RESULTS.md, sixth visit) ours took 106 ms for a 2k-token prefill against 81 ms at
TP=2 without EP, while stock went from 95 to 91 ms. This times one Flash MoE layer's forward per rank at a
2,048-token prefill in the three forms that question needs, interleaved in 5 rounds (median [min-max]):

  tp2       256 experts of I 1024 (TP=2's slice of every expert), every slot local
  ep        128 experts of I 2048 (EP's half of the experts), top-6 over all 256: about half the slots arrive as -1
            (another rank's experts) and routed_experts=256, as moe_method.local_routing hands them over
  ep_local  the same 128 experts with only the local slots (the -1 slots removed: 1,024 tokens routed among 128)

and, per form, the CUDA kernels' time by name (torch.profiler, 3 calls), so a gap shows where it is. Eager calls
(vLLM runs a 2k-token prefill outside the decode CUDA graphs) and CUDA-graph replays both.

The W4A16 path throughout (mode="w4a16"): what the forward takes at 2,048 tokens (48 rows per expert, under the FP8
prefill's 64); past about 2,730 tokens a plan with the FP8 prefill copy would switch, which this script does not model.

Usage (repo root, GPU host with torch and Triton): python3 bench/tools/ep_prefill_ab.py [--tokens 2048] [--max-slots N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())

HIDDEN, INTER, EXPERTS, TOP_K = 4096, 2048, 256, 6


def topk_ids(tokens: int, experts: int, gen: torch.Generator, dev) -> torch.Tensor:
    """Uniform top-6 without repeats per token (the synthetic gate's routing is close to uniform)."""
    scores = torch.rand(tokens, experts, device=dev, generator=gen)
    return scores.topk(TOP_K, dim=-1).indices.to(torch.int32)


def main() -> int:
    from nvfp4stack.bench.moe_kernel import _time_ms, random_nvfp4_experts
    from nvfp4stack.kernels.base import MoeWeights
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as fm
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward
    from nvfp4stack.kernels.moe.triton_w4a16 import TritonW4A16Moe

    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-slots", type=int, default=None,
                   help="routing_triton.MAX_SLOTS for this run (the Triton routing up to it, torch past it)")
    a = p.parse_args()
    if a.max_slots is not None:
        from nvfp4stack.kernels.moe.hopper_w4a16 import routing_triton

        routing_triton.MAX_SLOTS = a.max_slots
    if not torch.cuda.is_available():
        print("ep_prefill_ab: needs a CUDA GPU")
        return 2
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    t = a.tokens
    x = torch.randn(t, HIDDEN, device=dev, dtype=torch.bfloat16, generator=gen)
    ids = topk_ids(t, EXPERTS, gen, dev)
    wts = torch.softmax(torch.randn(t, TOP_K, device=dev, generator=gen), -1)

    def experts(e: int, inter: int):
        w13 = random_nvfp4_experts(e, 2 * inter, HIDDEN, dev, gen)
        w2 = random_nvfp4_experts(e, HIDDEN, inter, dev, gen)
        prep = TritonW4A16Moe.prepare(MoeWeights(w13, w2))
        return w13, w2, prep.weights.w13, prep.weights.w2, prep.tiled

    local = EXPERTS // 2
    ep_ids = torch.where(ids < local, ids, torch.full_like(ids, -1))   # rank 0's experts 0..127
    ep_w = torch.where(ep_ids < 0, torch.zeros_like(wts), wts)
    keep = (ids < local).sum(1) > 0
    # ep_local: the local slots only, packed into tokens of 6 (what the rank's experts actually receive)
    flat_ids, flat_tok = ids[ids < local], torch.arange(t, device=dev).repeat_interleave(TOP_K).view(t, TOP_K)[ids < local]
    n_loc = flat_ids.numel() // TOP_K * TOP_K
    loc_ids = flat_ids[:n_loc].view(-1, TOP_K).to(torch.int32)
    loc_x = x[flat_tok[:n_loc].view(-1, TOP_K)[:, 0]].contiguous()
    loc_w = torch.softmax(torch.randn(loc_ids.shape[0], TOP_K, device=dev, generator=gen), -1)
    # ids within a packed row of ep_local may repeat an expert: harmless for timing (a slot is a slot)

    w_tp = experts(EXPERTS, INTER // 2)
    w_ep = experts(local, INTER)
    forms = {
        "tp2": (x, wts, ids, w_tp, 0),
        "ep": (x, wts, ep_ids, w_ep, EXPERTS),
        "ep_local": (loc_x, loc_w, loc_ids, w_ep, 0),
    }
    print(f"Flash MoE layer per rank, {t}-token prefill, top-{TOP_K}, seed {a.seed}, {torch.cuda.get_device_name()}; "
          f"ep: {int((ep_ids >= 0).sum())} of {ep_ids.numel()} slots local ({int(keep.sum())} tokens with one)")

    def call(name):
        xx, ww, ii, (_, _, k13, k2, tiled), routed = forms[name]
        return fm.nvfp4_moe_forward_triton(xx, k13, k2, ww, ii, swiglu_limit=10.0, mode="w4a16", tiled=tiled,
                                           routed_experts=routed)

    # correctness first: each form against the fp32 twin (ep: -1 slots as weight-0 slots on expert 0)
    for name, (xx, ww, ii, (w13, w2, _, _, _), _) in forms.items():
        ref_ids, ref_w = (ii.clamp(min=0), ep_w) if name == "ep" else (ii, ww)
        ref = nvfp4_moe_forward(xx.float(), w13, w2, ref_w, ref_ids, swiglu_limit=10.0)
        out = call(name).float()
        err = float((out - ref).norm() / ref.norm())
        print(f"  {name}: rel err against the fp32 twin {err:.2e}")
        if not err < 1e-2:
            print(f"ep_prefill_ab: {name} is wrong (rel err {err:.2e} >= 1e-2)")
            return 1

    times = {(n, g): [] for n in forms for g in (False, True)}
    for _ in range(5):
        for n in forms:
            for g in (False, True):
                times[(n, g)].append(_time_ms(lambda: call(n), g, rep=200) * 1e3)
    print("\n| form | eager us, median [min-max] | CUDA graph us | vs tp2 (eager) |")
    print("|---|---|---|---|")
    base = statistics.median(times[("tp2", False)])
    for n in forms:
        e, g = times[(n, False)], times[(n, True)]
        print(f"| {n} | {statistics.median(e):.1f} [{min(e):.1f}-{max(e):.1f}] | {statistics.median(g):.1f} "
              f"[{min(g):.1f}-{max(g):.1f}] | {statistics.median(e) / base:.2f}x |")

    from torch.profiler import ProfilerActivity, profile
    for n in forms:
        call(n)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                call(n)
            torch.cuda.synchronize()
        rows = sorted(((ev.key, ev.device_time_total / 3, ev.count // 3) for ev in prof.key_averages()
                       if ev.device_time_total > 0), key=lambda r: -r[1])
        total = sum(r[1] for r in rows)
        print(f"\n{n}: GPU kernels {total:.1f} us a call")
        for key, us, cnt in rows[:8]:
            print(f"  {us:8.1f} us  x{cnt:<3d} {key[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
