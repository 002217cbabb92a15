"""Device script (not a pytest module): correctness and CUDA-graph timing of the W4A16 decode
variants against the Triton path and bf16 ``torch._grouped_mm``, DSV4 Flash/Pro, 32 experts, top-4.

Usage (repo root, GPU host): python3 bench/tools/decode_variants.py [--shapes flash,pro] [--tokens 1,4,16]
Prints one line per measurement (with --split 1, also the per-kernel device times of the default
and of the best variant: L1, L2, routing, top-k sum) and a table last.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())


def main() -> int:
    import triton
    import triton.testing as tt

    from nvfp4stack.bench.moe_kernel import (
        SHAPES,
        _bf16_pipeline,
        _short,
        balanced_routing,
        dequant_all,
        random_nvfp4_experts,
    )
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as tw
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="flash,pro")
    p.add_argument("--tokens", default="1,4,16")
    p.add_argument("--rep", type=int, default=60)
    p.add_argument("--cands", default="all", help="'all' or comma list of indices into DECODE_CANDIDATES")
    p.add_argument("--split", type=int, default=1, help="1: profile L1/L2 kernel times of auto and the best variant")
    p.add_argument("--cross", type=int, default=0, help="1: also every (L1, L2) pair of two candidates with the same block_t")
    a = p.parse_args()
    print(f"{torch.cuda.get_device_name(0)} torch {torch.__version__} triton {triton.__version__}", flush=True)
    dev = torch.device("cuda")
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    gen = torch.Generator(device=dev).manual_seed(seed)
    e, k, limit = 32, 4, 10.0
    cands = tw.DECODE_CANDIDATES if a.cands == "all" else tuple(tw.DECODE_CANDIDATES[int(i)] for i in a.cands.split(","))
    table = []
    from nvfp4stack.kernels.moe.hopper_w4a16.routing import align_by_expert
    from nvfp4stack.kernels.moe.hopper_w4a16.routing_triton import align_by_expert_triton
    for per_expert in (64, 256):
        ids, _ = balanced_routing(e, per_expert, k, dev, gen)
        for bm in (16, 64):
            t_a = tt.do_bench_cudagraph(lambda: align_by_expert(ids, e, bm), rep=a.rep, return_mode="median")
            t_b = tt.do_bench_cudagraph(lambda: align_by_expert_triton(ids, e, bm), rep=a.rep, return_mode="median")
            print(f"routing {per_expert}/exp ({ids.numel()} slots) block {bm}: torch {t_a * 1e3:.1f} us, triton {t_b * 1e3:.1f} us")
    for name in a.shapes.split(","):
        hidden, inter = SHAPES[name]
        w13 = random_nvfp4_experts(e, 2 * inter, hidden, dev, gen)
        w2 = random_nvfp4_experts(e, hidden, inter, dev, gen)
        w13t = dequant_all(w13).transpose(1, 2)
        w2t = dequant_all(w2).transpose(1, 2)
        for per_expert in [int(t) for t in a.tokens.split(",")]:
            ids, wts = balanced_routing(e, per_expert, k, dev, gen)
            tokens = ids.shape[0]
            x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
            slots = tokens * k
            x_sorted = torch.randn(slots, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
            offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * (slots // e)
            ref = nvfp4_moe_forward(x.float(), w13, w2, wts, ids, swiglu_limit=limit)

            def ours(cfg):
                return tw.nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=limit, config=cfg, mode="w4a16")

            t_bf16 = tt.do_bench_cudagraph(lambda: _bf16_pipeline(x_sorted, w13t, w2t, offs, limit), rep=a.rep,
                                           return_mode="median")
            row = {"shape": name, "tok": per_expert, "bf16": t_bf16}
            t_route = tt.do_bench_cudagraph(lambda: align_by_expert(ids, e, 8), rep=a.rep, return_mode="median")
            t_route_tr = tt.do_bench_cudagraph(lambda: align_by_expert_triton(ids, e, 8), rep=a.rep, return_mode="median")
            rws = torch.randn(slots, hidden, device=dev, dtype=torch.bfloat16)
            t_sum = tt.do_bench_cudagraph(lambda: rws.view(tokens, k, hidden).sum(dim=1, dtype=torch.float32).to(torch.bfloat16),
                                          rep=a.rep, return_mode="median")
            print(f"{name} {per_expert:3d}/exp routing alignment torch {t_route * 1e3:.1f} us, "
                  f"triton {t_route_tr * 1e3:.1f} us, top-k sum {t_sum * 1e3:.1f} us")
            variants = [("triton", tw.pick_config(slots / e)), ("auto", None)] + [
                (f"d{i}:{_short(c)}", c) for i, c in enumerate(cands)
                if c[0].fits(hidden, inter) and (c[0].block_t == 8 or per_expert > 8)
            ]
            # the picked pair (may differ between L1 and L2), labelled like the candidates
            pk = tw.pick_decode(slots / e, hidden, inter, dev)
            if pk is not None:
                variants.append((f"d-pick:{_short(pk)}", pk))
            if a.cross:  # L1 and L2 need only share the routing block (block_t)
                fit = [(i, c[0]) for i, c in enumerate(cands) if c[0].fits(hidden, inter)
                       and (c[0].block_t == 8) == (per_expert <= 8)]
                variants += [(f"d{i}/{j}:{_short((c1, c2))}", (c1, c2))
                             for i, c1 in fit for j, c2 in fit if i != j and c1.block_t == c2.block_t]
            for label, cfg in variants:
                try:
                    out = tw.nvfp4_moe_forward_triton(x, w13, w2, wts, ids, swiglu_limit=limit, config=cfg,
                                                      poison=True, mode="w4a16")
                    torch.cuda.synchronize()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    finite = bool(torch.isfinite(out).all())
                    t = tt.do_bench_cudagraph(lambda: ours(cfg), rep=a.rep, return_mode="median")
                except Exception as exc:  # report, keep going
                    print(f"{name} {per_expert} {label}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    continue
                ok = finite and err <= 1e-2
                print(f"{name} {per_expert:3d}/exp {label:22s} {t * 1e3:8.1f} us  x{t_bf16 / t:.2f} vs bf16 "
                      f"{t_bf16 * 1e3:.1f} us  rel err {err:.2e} {'ok' if ok else 'BAD'}", flush=True)
                row[label] = (t, err, ok)
            # per-kernel device time (eager launches under the profiler): L1 vs L2 vs routing/sum
            dec = {k_: v for k_, v in row.items() if k_.startswith("d") and v[2]}
            if dec and a.split:
                best = min(dec.items(), key=lambda kv: kv[1][0])[0]
                for label, cfg in (("auto", None), (best, dict(variants)[best])):
                    try:
                        row[f"split {label}"] = kernel_split(lambda: ours(cfg))
                    except Exception as exc:  # diagnostics only
                        row[f"split {label}"] = f"profiler failed: {type(exc).__name__}: {str(exc)[:120]}"
                    print(f"{name} {per_expert:3d}/exp {label:22s} per kernel (us): {row[f'split {label}']}", flush=True)
            table.append(row)
        torch.cuda.empty_cache()
    print("\n| shape | tok/exp | bf16 us | triton us (x) | auto us (x) | best decode variant us (x) |")
    print("|---|---|---|---|---|---|")
    for r in table:
        dec = {k: v for k, v in r.items() if k.startswith("d") and v[2]}
        best = min(dec.items(), key=lambda kv: kv[1][0]) if dec else None

        def cell(v):
            return f"{v[0] * 1e3:.1f} ({r['bf16'] / v[0]:.2f}x)" if v else ""
        print(f"| {r['shape']} | {r['tok']} | {r['bf16'] * 1e3:.1f} | {cell(r.get('triton'))} | {cell(r.get('auto'))} | "
              f"{best[0] + ' ' + cell(best[1]) if best else ''} |")
    print("\nevery variant, us (x bf16):")
    for r in table:
        print(f"{r['shape']} {r['tok']}: " + "; ".join(
            f"{k_} {v[0] * 1e3:.1f} ({r['bf16'] / v[0]:.2f}x){'' if v[2] else ' BAD'}"
            for k_, v in r.items() if isinstance(v, tuple)))
    return 0


def kernel_split(fn, iters: int = 30) -> str:
    """Mean device time per call of each kernel fn launches (torch.profiler, eager launches)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    tot: dict[str, float] = {}
    for ev in prof.events():
        if str(getattr(ev, "device_type", "")).endswith("CUDA"):  # kernels (device-side events)
            key = ev.name.split("(")[0][:40]
            tot[key] = tot.get(key, 0.0) + ev.time_range.elapsed_us()
    return ", ".join(f"{k} {v / iters:.1f}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1]) if v / iters >= 0.5)


if __name__ == "__main__":
    raise SystemExit(main())
