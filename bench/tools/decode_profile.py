"""Device script (not a pytest module): decode tiles of the W4A16 MoE at real EP loads, cold L2.

Usage (repo root, GPU host):
  python3 bench/tools/decode_profile.py [--loads flash64,pro48] [--rows 1,2,4,8,16]
      [--routing uniform,zipf] [--cands 16/4/64/4/0,8/4/128/2/0+8/2/128/4/1] [--split 8,16] [--layout tiles|rows]

A load is (shape, local experts, top-6) at ``rows`` average routed rows per expert
(tokens = ceil(rows * experts / top_k)); zipf draws experts with weight 1/rank**1.1. Each variant
is checked against the fp32 twin on the load's fresh random inputs (NaN-poisoned scratch), then timed
with the L2 flushed before every repetition: one CUDA graph replays (flush, call) N times, another
(flush) N times; the difference over N is the call's time. bf16 ``torch._grouped_mm`` is timed the same
way on the same routing. A candidate is ``block_t/mrep/block_k/warps/prefetch`` for both GEMMs, or
``L1+L2``; a trailing ``:serial`` runs a split tile's (big_t) two routings one after the other on one
stream instead of side by side (fused_moe.SPLIT_STREAMS). --split profiles the per-kernel device times of the pick and the best candidate.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.getcwd())

LOADS = {"flash64": ("flash", 64, 6), "pro48": ("pro", 48, 6), "flash32": ("flash", 32, 4), "pro32": ("pro", 32, 4)}


def parse_cand(spec: str):
    from nvfp4stack.kernels.moe.hopper_w4a16.fused_moe import DecodeConfig

    parts = [DecodeConfig(*(int(v) for v in p.split("/"))) for p in spec.split(":")[0].split("+")]
    return (parts[0], parts[-1])


def routing(tokens, experts, top_k, kind, gen, dev):
    p = torch.ones(experts, device=dev) if kind == "uniform" else \
        1.0 / torch.arange(1, experts + 1, device=dev, dtype=torch.float32) ** 1.1
    return torch.multinomial(p.expand(tokens, -1), top_k, generator=gen).to(torch.int32)


def main() -> int:
    import triton

    from bench.tools.decode_variants import kernel_split
    from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
    from nvfp4stack.bench.moe_kernel import SHAPES, _bf16_pipeline, dequant_all, random_nvfp4_experts
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as tw
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

    ap = argparse.ArgumentParser()
    ap.add_argument("--loads", default="flash64,pro48")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--routing", default="uniform,zipf")
    ap.add_argument("--cands", default="")
    ap.add_argument("--split", default="")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--layout", choices=("tiles", "rows"), default="tiles")
    a = ap.parse_args()
    dev = torch.device("cuda")
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"{torch.cuda.get_device_name(0)} torch {torch.__version__} triton {triton.__version__} seed={seed}", flush=True)
    gen = torch.Generator(device=dev).manual_seed(seed)
    flush = flush_buffer(dev)
    cands = [(c, parse_cand(c)) for c in a.cands.split(",") if c]
    split_rows = {float(r) for r in a.split.split(",") if r}
    table = []
    limit = 10.0
    for load in a.loads.split(","):
        shape, e, k = LOADS[load]
        hidden, inter = SHAPES[shape]
        w13 = random_nvfp4_experts(e, 2 * inter, hidden, dev, gen)
        w2 = random_nvfp4_experts(e, hidden, inter, dev, gen)
        w13t, w2t = dequant_all(w13).transpose(1, 2), dequant_all(w2).transpose(1, 2)
        # our kernels read what triton_w4a16's prepare gives (the tile layout on sm90) unless --layout rows
        tiled = a.layout == "tiles" and tiles.experts_fit(w13, w2)
        k13, k2 = tiles.tile_experts(w13, w2) if tiled else (w13, w2)
        per_expert_bytes = sum(t.data[0].numel() + t.scale[0].numel() for t in (w13, w2))
        for kind in a.routing.split(","):
            for rows in (float(r) for r in a.rows.split(",")):
                tokens = math.ceil(rows * e / k)
                ids = routing(tokens, e, k, kind, gen, dev)
                wts = torch.softmax(torch.randn(tokens, k, device=dev, generator=gen), -1)
                x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
                counts = torch.bincount(ids.reshape(-1).long(), minlength=e)
                active, cmax = int((counts > 0).sum()), int(counts.max())
                order = torch.argsort(ids.reshape(-1), stable=True)
                x_sorted = x[order // k].contiguous()
                offs = torch.cumsum(counts, 0).to(torch.int32)
                ref = nvfp4_moe_forward(x.float(), w13, w2, wts, ids, swiglu_limit=limit)
                nbytes = active * per_expert_bytes
                t_bf16 = cold_time_us(lambda: _bf16_pipeline(x_sorted, w13t, w2t, offs, limit), flush, a.n)
                label = f"{load} {kind} {rows:g} rows (T={tokens}, active {active}, max {cmax})"
                row = {"load": load, "kind": kind, "rows": rows, "tokens": tokens, "active": active, "max": cmax,
                       "bf16": t_bf16, "res": {}}
                for name, cfg in [("pick", None)] + cands:
                    if cfg is not None and not all(c.fits(hidden, inter) for c in cfg):
                        continue
                    tw.SPLIT_STREAMS = not name.endswith(":serial")
                    try:
                        out = tw.nvfp4_moe_forward_triton(x, k13, k2, wts, ids, swiglu_limit=limit, config=cfg,
                                                          poison=True, mode="w4a16", tiled=tiled)
                        err = ((out.float() - ref).norm() / ref.norm()).item() if torch.isfinite(out).all() else float("inf")
                        t = cold_time_us(lambda: tw.nvfp4_moe_forward_triton(
                            x, k13, k2, wts, ids, swiglu_limit=limit, config=cfg, mode="w4a16", tiled=tiled), flush, a.n)
                    except Exception as exc:  # a variant that fails is reported, not fatal
                        print(f"{label} {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                        continue
                    ok = err <= 1e-2
                    row["res"][name] = (t, err, ok)
                    print(f"{label} {name:28s} {t:8.1f} us {nbytes / t / 1e6:5.2f} TB/s x{t_bf16 / t:.2f} bf16 "
                          f"({t_bf16:.1f} us) err {err:.1e} {'ok' if ok else 'BAD'}", flush=True)
                if rows in split_rows:
                    good = {n: v for n, v in row["res"].items() if v[2]}
                    best = min(good, key=lambda n: good[n][0]) if good else "pick"
                    for name in dict.fromkeys(("pick", best)):
                        cfg = None if name == "pick" else dict(cands)[name]
                        tw.SPLIT_STREAMS = not name.endswith(":serial")
                        s = kernel_split(lambda: tw.nvfp4_moe_forward_triton(
                            x, k13, k2, wts, ids, swiglu_limit=limit, config=cfg, mode="w4a16", tiled=tiled))
                        print(f"{label} {name} per kernel (us, warm L2, eager): {s}", flush=True)
                table.append(row)
        del w13, w2
        w13t = w2t = None  # frees the bf16 copies (a `del` would leave the lambdas above an unbound name)
        torch.cuda.empty_cache()
    print("\n| load | routing | rows/exp | tokens | active | max rows | bf16 us | pick us (x bf16) | best us (x bf16) | best |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        good = {n: v for n, v in r["res"].items() if v[2]}
        best = min(good, key=lambda n: good[n][0]) if good else None
        pk = r["res"].get("pick")

        def cell(v):
            return f"{v[0]:.1f} ({r['bf16'] / v[0]:.2f}x)" if v else "-"
        print(f"| {r['load']} | {r['kind']} | {r['rows']:g} | {r['tokens']} | {r['active']} | {r['max']} | {r['bf16']:.1f} "
              f"| {cell(pk)} | {cell(good.get(best))} | {best} |")
    bad = [(r["load"], r["kind"], r["rows"], n) for r in table for n, v in r["res"].items() if not v[2]]
    if bad:
        print(f"relative error above 1e-2: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
