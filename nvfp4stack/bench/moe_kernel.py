"""Benchmark of the NVFP4 W4A16 MoE kernel against bf16 ``torch._grouped_mm`` and naive dequant.

``python -m nvfp4stack.bench.moe_kernel`` needs only torch, triton and nvfp4stack.formats/kernels
(the GPU hosts have no vLLM, modelopt or Hydra). Per flagship expert shape and tokens per expert it
prints time, effective TB/s on the NVFP4 weight bytes (packed + block scales), TFLOP/s, and the
speed-up over the bf16 grouped GEMM pipeline timed in the same run, for the W4A16 kernel, the
FP8-compute prefill mode (fp8_prefill.py) and what ``mode="auto"`` picks at each load.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from dataclasses import dataclass

import torch

SHAPES = {"flash": (4096, 2048), "pro": (7168, 3072)}  # (hidden, moe_inter) of the flagship's Flash and Pro models (their published configs)
TOKENS_PER_EXPERT = (1, 4, 16, 64, 256, 1024, 4096)


@dataclass
class MoeKernelBench:
    """Arguments of one benchmark run (also the fields read from cfg.bench by ``run``)."""

    shapes: tuple[str, ...] = ("flash", "pro")
    tokens_per_expert: tuple[int, ...] = TOKENS_PER_EXPERT
    experts: int = 32
    top_k: int = 4
    swiglu_limit: float = 10.0
    naive: bool = True
    sweep: bool = False  # time every candidate tile config, report the best and the heuristic's
    diag: bool = False  # with sweep: also time the no-dequant diagnostic configs (wrong numbers)
    graph_max_per_expert: int = 64  # time with CUDA-graph replay up to this load (decode-like)
    seed: int | None = None
    out: str | None = None  # also write the markdown table to this file


def random_nvfp4_experts(e: int, n: int, k: int, device, gen: torch.Generator):
    """Random valid NVFP4 [E, N, K]: every byte is two legal E2M1 codes; scales span 2**-6..2**2."""
    from nvfp4stack.formats.nvfp4 import Nvfp4Tensor

    data = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device=device, generator=gen)
    bs = torch.exp2(torch.rand(e, n, k // 16, device=device, generator=gen) * 8 - 6)
    scale = bs.to(torch.float8_e4m3fn)
    gs = (torch.rand(e, device=device, generator=gen) + 0.5) * 1e-2
    return Nvfp4Tensor(data, scale, gs, (e, n, k))


def random_tiled_experts(e: int, hidden: int, inter: int, device, gen: torch.Generator):
    """Random NVFP4 w13 [E, 2I, H] then w2 [E, H, I] (``random_nvfp4_experts``, in that order from ``gen``), their
    bytes in tiles.py's layout: the experts as triton_w4a16 prepares them on sm90."""
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles

    return tiles.tile_experts(random_nvfp4_experts(e, 2 * inter, hidden, device, gen),
                              random_nvfp4_experts(e, hidden, inter, device, gen))


def balanced_routing(experts: int, per_expert: int, top_k: int, device, gen):
    """Routing where every expert gets exactly ``per_expert`` slots, shuffled over tokens."""
    tokens = experts * per_expert // top_k
    slots = torch.arange(tokens * top_k, device=device) % experts
    # permute token order so an expert's tokens are not contiguous in x
    perm = torch.randperm(tokens, device=device, generator=gen)
    ids = slots.view(tokens, top_k)[perm].to(torch.int32)
    w = torch.rand(tokens, top_k, device=device, generator=gen)
    return ids, w / w.sum(-1, keepdim=True)


def dequant_all(w, dtype=torch.bfloat16) -> torch.Tensor:
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import dequantize_expert

    return torch.stack([dequantize_expert(w, i).to(dtype) for i in range(w.shape[0])])


def _bf16_pipeline(x_sorted, w13t, w2t, offs, limit):
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import clamped_swiglu

    h = torch._grouped_mm(x_sorted, w13t, offs=offs)
    h = clamped_swiglu(h, limit)
    return torch._grouped_mm(h, w2t, offs=offs)


def _time_ms(fn, graph: bool, rep: int = 60) -> float:
    """Median ms. graph=True times CUDA-graph replays (as vLLM runs decode), which removes the
    host launch gaps that otherwise dominate sub-millisecond MoE steps; used for both sides."""
    import triton.testing as tt

    if graph:
        return tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")
    return tt.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def _short(pair) -> str:
    """'BMxBNxBK/w<warps>/s<stages>/d<dequant>' for L1 (and L2 when it differs)."""
    def one(c):
        if hasattr(c, "mrep"):  # triton_w4a16.DecodeConfig (Gluon decode kernels; wgmma ones say which)
            kind = {0: "", 1: "/staged", 2: "/staged-w1", 3: "/ring"}[c.wgmma] + (f"+t{c.big_t}" if c.big_t else "")
            split = f"/sk{c.split_k}" if c.split_k > 1 else ""
            cap = f"/r{c.maxnreg}" if c.maxnreg else ""
            return f"gluon t{c.block_t}/m{c.mrep}/k{c.block_k}/w{c.num_warps}/p{c.prefetch}{split}{cap}{kind}"
        return f"{c.block_m}x{c.block_n}x{c.block_k}/w{c.num_warps}/s{c.num_stages}/d{c.deq}"
    return one(pair[0]) + ("" if pair[0] == pair[1] else "+" + one(pair[1]))


def bench_shape(args: MoeKernelBench, name: str, log) -> list[dict]:
    import triton.testing as tt

    from nvfp4stack.kernels.base import MoeWeights
    from nvfp4stack.kernels.moe.hopper_w4a16 import fp8_prefill as fp
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as tw
    from nvfp4stack.kernels.moe.triton_w4a16 import TritonW4A16Moe

    hidden, inter = SHAPES[name]
    dev = torch.device("cuda")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    log(f"[{name}] seed={seed}")
    gen = torch.Generator(device=dev).manual_seed(seed)
    e = args.experts
    w13 = random_nvfp4_experts(e, 2 * inter, hidden, dev, gen)
    w2 = random_nvfp4_experts(e, hidden, inter, dev, gen)
    w13t = dequant_all(w13).transpose(1, 2)  # [E, H, 2I] view for _grouped_mm
    w2t = dequant_all(w2).transpose(1, 2)  # [E, I, H]
    nvfp4_bytes = sum(t.data.numel() + t.scale.numel() for t in (w13, w2))
    try:  # load-time cost of the FP8 copy, timed once
        torch.cuda.synchronize()
        t0 = _dt.datetime.now()
        fp8w = fp.prepare_fp8_experts(w13, w2)
        torch.cuda.synchronize()
        log(f"[{name}] fp8 prepare: {(_dt.datetime.now() - t0).total_seconds():.2f} s, "
            f"{fp8w.nbytes / 1e9:.2f} GB FP8 copy vs {nvfp4_bytes / 1e9:.2f} GB NVFP4")
    except Exception as exc:
        log(f"[{name}] fp8 prepare failed: {type(exc).__name__}: {str(exc)[:200]}")
        fp8w = None
    # our kernels read what triton_w4a16's prepare gives here (the tile layout on sm90 where the shape tiles)
    prepared = TritonW4A16Moe.prepare(MoeWeights(w13, w2))
    k13, k2, tiled = prepared.weights.w13, prepared.weights.w2, prepared.tiled
    log(f"[{name}] weight layout of our kernels: {'tiles' if tiled else 'rows'}")
    params = e * 3 * hidden * inter
    rows = []
    for per_expert in args.tokens_per_expert:
        ids, wts = balanced_routing(e, per_expert, args.top_k, dev, gen)
        tokens = ids.shape[0]
        x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
        slots = tokens * args.top_k
        x_sorted = torch.randn(slots, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
        offs = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * (slots // e)

        def ours(cfg=None, mode="w4a16"):
            return tw.nvfp4_moe_forward_triton(
                x, k13, k2, wts, ids, swiglu_limit=args.swiglu_limit, config=cfg, mode=mode,
                fp8_weights=fp8w, tiled=tiled,
            )

        # what the forward picks: the Gluon decode kernels up to DECODE_MAX_ROWS_PER_EXPERT (split-K where a launch
        # would leave the GPU under-filled), else Triton tiles
        heur = tw.pick_call(slots / e, slots, e, hidden, inter, tw.decode_available(dev), tw.sm_count(dev))
        graph = per_expert <= args.graph_max_per_expert
        t_ours = _time_ms(lambda: ours(heur), graph)
        best_cfg, t_best = heur, t_ours
        t_triton_path = float("nan")
        if isinstance(heur[0], tw.DecodeConfig):  # the Triton kernels at the same load, for reference
            t_triton_path = _time_ms(lambda: ours(tw.pick_config(slots / e)), graph)
        if args.sweep:
            decode_cands = tuple(c for c in tw.DECODE_CANDIDATES if c[0].fits(hidden, inter)
                                 and c[0].block_t == heur[0].block_t) if isinstance(heur[0], tw.DecodeConfig) else ()
            for cand in tw.CANDIDATES + decode_cands + (tw.DIAG if args.diag else ()):
                bm = cand[0].block_m
                # M tiles far from the load (tiny at prefill, big at decode) are known losers
                if cand == heur or bm > max(32, per_expert) or bm < min(64, per_expert // 4):
                    continue
                if tiled and cand[0].deq == 1:  # per-element dequant reads row-major bytes only
                    continue
                try:
                    t = _time_ms(lambda: ours(cand), graph, rep=40)
                except Exception as exc:  # a tile that does not compile is reported, not fatal
                    log(f"  config {cand} failed: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                log(f"  {name} {per_expert:5d}/exp {_short(cand)}: {t * 1e3:9.1f} us")
                if t < t_best and cand[0].deq != 9:
                    best_cfg, t_best = cand, t
        t_fp8 = float("nan")
        if fp8w is not None:
            for as_graph in dict.fromkeys((graph, False)):  # a graph-capture failure retries eager
                try:
                    t_fp8 = _time_ms(lambda: ours(mode="fp8"), as_graph)
                    break
                except Exception as exc:  # reported in the table as missing, not fatal
                    log(f"  fp8 mode failed at {per_expert}/exp (graph={as_graph}): "
                        f"{type(exc).__name__}: {str(exc)[:200]}")
        t_fp8_gemm = float("nan")  # the two FP8 GEMMs alone on pre-sorted, pre-quantized rows
        if fp8w is not None and not (t_fp8 != t_fp8):
            xq, xs = fp.quantize_rows_fp8(x_sorted)
            hq, hs = fp.quantize_rows_fp8(x_sorted[:, :inter].contiguous())

            def fp8_gemms():
                torch._scaled_grouped_mm(xq, fp8w.w13.transpose(1, 2), xs, fp8w.w13_scale, offs=offs,
                                         out_dtype=torch.bfloat16)
                torch._scaled_grouped_mm(hq, fp8w.w2.transpose(1, 2), hs, fp8w.w2_scale, offs=offs,
                                         out_dtype=torch.bfloat16)

            t_fp8_gemm = _time_ms(fp8_gemms, graph)
        auto = fp.select_mode("auto", slots / e, fp8w)
        t_auto = t_fp8 if auto == "fp8" else t_ours
        t_bf16 = _time_ms(lambda: _bf16_pipeline(x_sorted, w13t, w2t, offs, args.swiglu_limit), graph)
        t_naive = float("nan")
        if args.naive and per_expert in (1, 1024):
            t_naive = tt.do_bench(
                lambda: _bf16_pipeline(
                    x_sorted, dequant_all(w13).transpose(1, 2), dequant_all(w2).transpose(1, 2),
                    offs, args.swiglu_limit,
                ),
                warmup=1, rep=20, return_mode="median",
            )
        flops = 2.0 * slots * 3 * hidden * inter
        row = dict(
            shape=name, per_expert=per_expert, tokens=tokens, ms=t_ours,
            tbs=nvfp4_bytes / (t_ours * 1e-3) / 1e12, tflops=flops / (t_ours * 1e-3) / 1e12,
            bf16_ms=t_bf16, bf16_tbs=params * 2 / (t_bf16 * 1e-3) / 1e12,
            bf16_tflops=flops / (t_bf16 * 1e-3) / 1e12, speedup=t_bf16 / t_ours,
            naive_ms=t_naive, fp8_ms=t_fp8, fp8_gemm_ms=t_fp8_gemm, fp8_tflops=flops / (t_fp8 * 1e-3) / 1e12,
            fp8_speedup=t_bf16 / t_fp8, auto=auto, auto_speedup=t_bf16 / t_auto,
            timing="graph" if graph else "eager", best_ms=t_best, best_cfg=_short(best_cfg),
            triton_path_ms=t_triton_path,
        )
        log(
            f"[{name}] {per_expert:5d}/exp: ours {t_ours * 1e3:9.1f} us ({row['tbs']:.2f} TB/s, "
            f"{row['tflops']:.0f} TF/s) fp8 {t_fp8 * 1e3:9.1f} us x{row['fp8_speedup']:.2f} "
            f"(GEMMs only {t_fp8_gemm * 1e3:.1f} us) "
            f"bf16 {t_bf16 * 1e3:9.1f} us x{row['speedup']:.2f} auto={auto} "
            f"best {t_best * 1e3:.1f} us {_short(best_cfg)} [{_short(heur)}]"
            + (f"; triton-path {t_triton_path * 1e3:.1f} us x{t_bf16 / t_triton_path:.2f}" if graph and t_triton_path == t_triton_path else "")
        )
        rows.append(row)
    w13t = w2t = None   # drop the big expert tensors before emptying the cache
    torch.cuda.empty_cache()
    return rows


def _fp8_threshold() -> int:
    from nvfp4stack.kernels.moe.hopper_w4a16.fp8_prefill import FP8_MIN_ROWS_PER_EXPERT

    return FP8_MIN_ROWS_PER_EXPERT


def markdown(rows: list[dict], args: MoeKernelBench) -> str:
    import triton

    dev = torch.cuda.get_device_name(0)
    head = (
        f"device: {dev}; date: {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"torch {torch.__version__}, triton {triton.__version__}; E={args.experts} local experts, "
        f"top-{args.top_k}, swiglu_limit={args.swiglu_limit}; TB/s counts NVFP4 weight bytes "
        "(packed + e4m3 scales) for w4a16 and bf16 weight bytes for grouped_mm; bf16 = "
        "_grouped_mm(L1) + clamped SwiGLU + _grouped_mm(L2) on pre-sorted tokens; w4a16 and fp8 "
        "include routing alignment, gather, scatter and top-k combine (fp8 also the per-token "
        "activation quantization; its weights are converted once before timing); fp8 GEMMs only = the "
        "two torch._scaled_grouped_mm calls on pre-sorted, pre-quantized rows. auto = the mode "
        f"mode='auto' picks (fp8 from {_fp8_threshold()} routed rows/expert). timing: graph = CUDA-graph replay "
        "for both sides (decode-like loads), eager = do_bench launches.\n\n"
    )
    sweep = args.sweep
    cols = ["shape", "tok/expert", "timing", "w4a16 us", "w4a16 TB/s", "w4a16 TFLOP/s", "fp8 us",
            "fp8 TFLOP/s", "fp8 GEMMs only us", "bf16 us", "bf16 TB/s", "bf16 TFLOP/s", "w4a16 vs bf16", "fp8 vs bf16",
            "auto: mode, vs bf16", "naive dequant+mm us"] + (["best sweep us", "best tiles"] if sweep else [])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def num(v, fmt):  # NaN (not measured) -> empty cell
        return "" if v != v else format(v, fmt)

    for r in rows:
        cells = [
            r["shape"], str(r["per_expert"]), r["timing"], num(r["ms"] * 1e3, ".1f"), num(r["tbs"], ".2f"),
            num(r["tflops"], ".0f"), num(r["fp8_ms"] * 1e3, ".1f"), num(r["fp8_tflops"], ".0f"),
            num(r["fp8_gemm_ms"] * 1e3, ".1f"),
            num(r["bf16_ms"] * 1e3, ".1f"), num(r["bf16_tbs"], ".2f"), num(r["bf16_tflops"], ".0f"),
            num(r["speedup"], ".2f") + "x", num(r["fp8_speedup"], ".2f") + "x",
            f"{r['auto']} {num(r['auto_speedup'], '.2f')}x", num(r["naive_ms"] * 1e3, ".0f"),
        ] + ([num(r["best_ms"] * 1e3, ".1f"), r["best_cfg"]] if sweep else [])
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def main_args(args: MoeKernelBench) -> int:
    if not torch.cuda.is_available():
        print("moe_kernel bench: needs a CUDA GPU (none visible); nothing measured", file=sys.stderr)
        return 2
    from tqdm import tqdm

    rows = []
    for name in tqdm(args.shapes, desc="moe_kernel shapes", file=sys.stderr):
        rows += bench_shape(args, name, lambda s: print(s, flush=True))
    table = markdown(rows, args)
    print(table)
    if args.out:
        tmp = f"{args.out}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(table)
        os.replace(tmp, args.out)  # atomic: a reader never sees half a table
    return 0


def run(cfg) -> int:
    """Entry point for ``main.py bench bench=moe_kernel``: reads cfg.bench (bench/config.py)."""
    b = cfg.bench
    args = MoeKernelBench(
        shapes=tuple(b.shapes), tokens_per_expert=tuple(int(t) for t in b.tokens_per_expert),
        experts=int(b.num_experts),
    )
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        raise ValueError(f"bench.shapes: unknown {unknown}; valid: {', '.join(SHAPES)}")
    return main_args(args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="flash,pro")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS_PER_EXPERT)))
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--no-naive", action="store_true")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--diag", action="store_true", help="with --sweep: time no-dequant diagnostics")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    a = p.parse_args(argv)
    args = MoeKernelBench(
        shapes=tuple(a.shapes.split(",")), tokens_per_expert=tuple(int(t) for t in a.tokens.split(",")),
        experts=a.experts, top_k=a.top_k, naive=not a.no_naive, sweep=a.sweep, diag=a.diag, seed=a.seed,
        out=a.out,
    )
    return main_args(args)


if __name__ == "__main__":
    raise SystemExit(main())
