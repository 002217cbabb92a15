"""Decode at engine batch sizes: ``tokens x top_k`` routed slots over ``experts`` (most idle).

``python -m nvfp4stack.bench.moe_few_tokens [--shape flash] [--experts 64] [--top-k 6]
[--tokens 1,2,4,8,16 | --rows 1,2,4,8,16] [--routing uniform,zipf] [--l2 cold|warm] [--layout auto|rows|tiles]`` (GPU host; torch +
triton only). ``--rows`` gives average routed rows per expert (tokens = ceil(rows x experts / top_k)). At
batch 1-10 with the Flash shape's 64 local experts and top-6 most experts get no token, a load that
``bench.moe_kernel`` (every expert ``n`` rows) never shows. Per load it times, with CUDA-graph
replay and, by default, the L2 flushed before every call on every side (nvfp4stack/bench/cold_l2.py), the
tiles the forward picks, every decode tile candidate that fits the shape, the Triton
path, and bf16 ``torch._grouped_mm`` on the same routing (gather, two grouped GEMMs, SwiGLU), and
prints us and TB/s on the NVFP4 bytes of the experts that received tokens. Where vLLM for CUDA is
installed (the offline bundle), vLLM's fused Marlin NVFP4 MoE runs on the same weights
(bench/marlin_moe.py), and so does vLLM 0.26's Humming NVFP4 MoE where the ``humming`` package is
installed too (bench/humming_moe.py; unclamped SwiGLU, as vLLM runs it). Every run checks the picked
tiles, Marlin and Humming against the fp32 twin on its fresh random inputs and exits 1 where any is
off by more than 1e-2.
"""
from __future__ import annotations

import argparse
import math
import os

import torch

from nvfp4stack.bench import humming_moe, marlin_moe
from nvfp4stack.bench.cold_l2 import cold_time_us, flush_buffer
from nvfp4stack.bench.moe_kernel import SHAPES, _bf16_pipeline, _short, _time_ms, dequant_all, random_nvfp4_experts
from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward

# Nominal HBM bandwidth (TB/s) by the name torch gives the device, most specific first: the datasheet
# figure the "% of HBM peak" is taken against (H200 SXM 4.8 TB/s, H100 SXM 3.35, H100 PCIe 2.0).
HBM_PEAK_TBS = (("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35), ("H20", 4.0),
                ("B200", 8.0), ("GB200", 8.0), ("A100-SXM4-80GB", 2.04), ("A100", 1.56))


def hbm_peak_tbs(device_name: str) -> float | None:
    """The nominal HBM bandwidth of ``device_name`` (TB/s), or None for a GPU this table does not know."""
    return next((tbs for key, tbs in HBM_PEAK_TBS if key in device_name), None)


def expert_bytes(w13, w2) -> int:
    """HBM bytes one routed expert's weights take (w13 and w2: packed codes and e4m3 scales), the "% of HBM" numerator
    per active expert."""
    return sum(t.data[0].numel() * t.data.element_size() + t.scale[0].numel() * t.scale.element_size() for t in (w13, w2))


def routing(tokens: int, experts: int, top_k: int, kind: str, gen: torch.Generator, device) -> torch.Tensor:
    """[tokens, top_k] distinct experts per token: uniform, or Zipf (exponent 1.1) over experts."""
    if kind == "uniform":
        p = torch.ones(experts, device=device)
    elif kind == "zipf":
        p = 1.0 / torch.arange(1, experts + 1, device=device, dtype=torch.float32) ** 1.1
    else:
        raise ValueError(f"--routing: expected uniform or zipf, found {kind!r}")
    return torch.multinomial(p.expand(tokens, -1), top_k, generator=gen).to(torch.int32)


def call_inputs(tokens: int, experts: int, top_k: int, hidden: int, kind: str, gen: torch.Generator, device):
    """One MoE call's inputs, drawn from ``gen`` in this order: the routing (``routing``), its softmax weights
    [tokens, top_k] fp32, the activations [tokens, hidden] bf16."""
    ids = routing(tokens, experts, top_k, kind, gen, device)
    wts = torch.softmax(torch.randn(tokens, top_k, device=device, generator=gen), -1)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, generator=gen)
    return ids, wts, x


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="flash")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--rows", default=None,
                    help="average routed rows per expert, e.g. 1,2,4,8,16 (instead of --tokens)")
    ap.add_argument("--l2", choices=("cold", "cold-dirty", "warm"), default="cold",
                    help="cold: flush the L2 before every timed call by reading a buffer 4x its size (weights "
                         "come from HBM, the L2 left clean, as in a real decode step); cold-dirty: flush by "
                         "zeroing that buffer (the L2 left dirty: its write-back shares the call's bandwidth; "
                         "the figures before 2026-11-29); warm: back-to-back graph replays")
    ap.add_argument("--routing", default="uniform,zipf")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--marlin", choices=("auto", "on", "off"), default="auto",
                    help="vLLM's fused Marlin NVFP4 MoE on the same weights (needs vLLM for CUDA): "
                         "auto = where importable, on = refuse to run without it")
    ap.add_argument("--humming", choices=("auto", "on", "off"), default="auto",
                    help="vLLM's Humming NVFP4 MoE on the same weights, unclamped SwiGLU (needs vLLM 0.26's CUDA "
                         "build and humming-kernels): auto = where it runs, on = refuse to run without it")
    ap.add_argument("--layout", choices=("auto", "rows", "tiles"), default="auto",
                    help="packed weight bytes of our kernels: auto = what triton_w4a16's prepare gives on this "
                         "GPU (tiles on sm90 where the shape tiles), rows = the checkpoint's row-major bytes, "
                         "tiles = hopper_w4a16/tiles.py's layout")
    ap.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                    help="also time every decode tile candidate and the Triton path (--no-sweep: picked only)")
    return ap


def token_counts(tokens: str, rows: str | None, experts: int, top_k: int) -> list[int]:
    """Batch sizes to run: ``--tokens`` as given, or for ``--rows`` (average routed rows per expert)
    the smallest batch that reaches each average."""
    if rows:
        return [math.ceil(float(r) * experts / top_k) for r in rows.split(",")]
    return [int(t) for t in tokens.split(",")]


def main(argv: list[str] | None = None) -> int:
    from nvfp4stack.kernels.base import MoeWeights
    from nvfp4stack.kernels.moe.hopper_w4a16 import fused_moe as tw
    from nvfp4stack.kernels.moe.hopper_w4a16 import tiles
    from nvfp4stack.kernels.moe.triton_w4a16 import TritonW4A16Moe

    a = parser().parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_few_tokens: needs a CUDA GPU (the Triton/Gluon kernels); nothing run")
        return 2
    dev = torch.device("cuda")
    hidden, inter = SHAPES[a.shape]
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device=dev).manual_seed(seed)
    e, k = a.experts, a.top_k
    w13 = random_nvfp4_experts(e, 2 * inter, hidden, dev, gen)
    w2 = random_nvfp4_experts(e, hidden, inter, dev, gen)
    w13t, w2t = dequant_all(w13).transpose(1, 2), dequant_all(w2).transpose(1, 2)
    per_expert_bytes = expert_bytes(w13, w2)
    peak = hbm_peak_tbs(torch.cuda.get_device_name())
    print(f"{a.shape} {hidden}x{inter}, {e} experts, top-{k}, seed={seed}, {torch.cuda.get_device_name()}, "
          f"HBM peak {'unknown (no % column)' if peak is None else f'{peak} TB/s (nominal)'}")
    cands = [c for c in tw.DECODE_CANDIDATES if c[0].fits(hidden, inter)] if a.sweep else []
    if a.layout == "auto":  # what our kernels read in the engine: triton_w4a16's prepare on this GPU
        prepared = TritonW4A16Moe.prepare(MoeWeights(w13, w2))
        k13, k2, tiled = prepared.weights.w13, prepared.weights.w2, prepared.tiled
    else:
        tiled = a.layout == "tiles"
        k13, k2 = tiles.tile_experts(w13, w2) if tiled else (w13, w2)
    print(f"our kernels' weight layout: {'tiles' if tiled else 'rows'} (--layout {a.layout})")
    marlin = None
    if a.marlin != "off":
        ok, why = marlin_moe.available()
        if not ok and a.marlin == "on":
            print(f"moe_few_tokens: --marlin on, but {why}")
            return 2
        marlin = marlin_moe.prepare(w13, w2) if ok else None
        print(f"marlin column: {why if ok else 'left out: ' + why}")
    humming = None
    if a.humming != "off":
        ok, why = humming_moe.available()
        if ok:
            try:
                humming = humming_moe.prepare(w13, w2, k, max(token_counts(a.tokens, a.rows, e, k)))
            except Exception as exc:  # noqa: BLE001 - a baseline that cannot start is left out, said why
                ok, why = False, f"vLLM's Humming preparation failed ({type(exc).__name__}: {str(exc)[:200]})"
        if not ok and a.humming == "on":
            print(f"moe_few_tokens: --humming on, but {why}")
            return 2
        print(f"humming column: {why if ok else 'left out: ' + why}")
    flush = flush_buffer(dev) if a.l2 != "warm" else None

    def timed(fn, rep: int = 60) -> float:  # ms
        if flush is None:
            return _time_ms(fn, True, rep=rep)
        return cold_time_us(fn, flush, dirty=a.l2 == "cold-dirty") / 1e3

    print(f"timing: CUDA-graph replay, L2 {a.l2}")
    summary, bad = [], []
    for kind in a.routing.split(","):
        for tokens in token_counts(a.tokens, a.rows, e, k):
            ids, wts, x = call_inputs(tokens, e, k, hidden, kind, gen, dev)
            counts = torch.bincount(ids.reshape(-1).long(), minlength=e)
            active, busiest = int((counts > 0).sum()), int(counts.max())
            offs = torch.cumsum(counts, 0).to(torch.int32)
            order = torch.argsort(ids.reshape(-1), stable=True)
            x_sorted = x[(order // k)].contiguous()
            nbytes = active * per_expert_bytes

            def ours(cfg, poison=False):
                return tw.nvfp4_moe_forward_triton(x, k13, k2, wts, ids, swiglu_limit=10.0, config=cfg, mode="w4a16",
                                                   tiled=tiled, poison=poison)

            # what the forward picks with no override (split-K included where the GPU would be under-filled)
            heur = tw.pick_call(tokens * k / e, tokens * k, e, hidden, inter, tw.decode_available(dev), tw.sm_count(dev))
            # fresh random inputs every run: the picked tiles (and Marlin) against the fp32 twin
            ref = nvfp4_moe_forward(x.float(), w13, w2, wts, ids, swiglu_limit=10.0)
            err = _rel_err(ours(heur, poison=True), ref)
            t_heur = timed(lambda: ours(heur))
            t_marlin = err_marlin = None
            if marlin is not None:
                err_marlin = _rel_err(marlin_moe.forward(marlin, x, wts, ids, swiglu_limit=10.0), ref)
                t_marlin = timed(lambda: marlin_moe.forward(marlin, x, wts, ids, swiglu_limit=10.0))
            t_humming = err_humming = None
            if humming is not None:  # no clamp in vLLM's Humming: against the unclamped twin
                ref_plain = nvfp4_moe_forward(x.float(), w13, w2, wts, ids, swiglu_limit=None)
                try:
                    err_humming = _rel_err(humming_moe.forward(humming, x, wts, ids), ref_plain)
                    t_humming = timed(lambda: humming_moe.forward(humming, x, wts, ids))
                except Exception as exc:  # noqa: BLE001 - auto: the column stops, the bench goes on
                    if a.humming == "on":
                        raise
                    print(f"humming column: left out from {kind} T={tokens} on: {type(exc).__name__}: "
                          f"{str(exc)[:200]}")
                    humming, t_humming, err_humming = None, None, None
            t_bf16 = timed(lambda: _bf16_pipeline(x_sorted, w13t, w2t, offs, 10.0))
            best, t_best = heur, t_heur
            for cand in cands + ([tw.pick_config(tokens * k / e)] if a.sweep else []):
                if cand == heur:
                    continue
                try:
                    t = timed(lambda: ours(cand), rep=40)
                except Exception as exc:  # a tile that fails is reported, not fatal
                    print(f"  {_short(cand)} failed: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                print(f"  {kind:7s} T={tokens:3d} active={active:3d} {_short(cand):60s} {t * 1e3:8.1f} us")
                if t < t_best:
                    best, t_best = cand, t
            marlin_cells = ("", "", "") if t_marlin is None else (
                f"{t_marlin * 1e3:.1f}", f"{t_marlin / t_heur:.2f}x", f"{err_marlin:.1e}")
            humming_cells = ("", "", "") if t_humming is None else (
                f"{t_humming * 1e3:.1f}", f"{t_humming / t_heur:.2f}x", f"{err_humming:.1e}")
            tbs = nbytes / t_heur / 1e9
            row = (kind, tokens, tokens * k / e, f"{active} / {busiest}", t_heur * 1e3, tbs,
                   "" if peak is None else f"{100 * tbs / peak:.0f}%", f"{err:.1e}",
                   t_best * 1e3, _short(best), t_bf16 * 1e3, t_bf16 / t_heur, *marlin_cells, *humming_cells)
            summary.append(row)
            print(f"  {kind:7s} T={tokens:3d} active={active:3d} picked {_short(heur)}: {t_heur * 1e3:.1f} us, "
                  f"rel err {err:.2e}" + ("" if t_marlin is None else
                                         f"; marlin {t_marlin * 1e3:.1f} us, rel err {err_marlin:.2e}")
                  + ("" if t_humming is None else f"; humming {t_humming * 1e3:.1f} us, rel err {err_humming:.2e}"))
            if any(v is not None and v > 1e-2 for v in (err, err_marlin, err_humming)):
                marlin_err = "not run" if err_marlin is None else f"{err_marlin:.2e}"
                humming_err = "not run" if err_humming is None else f"{err_humming:.2e}"
                bad.append(f"{kind} T={tokens}: rel err ours {err:.2e}, marlin {marlin_err}, humming {humming_err}")
    print("\n| routing | tokens | rows/expert | active experts / busiest rows | picked us | picked TB/s | % of HBM peak | picked rel err "
          "| best us "
          "| best tile | bf16 us | picked vs bf16 | marlin us | picked vs marlin | marlin rel err "
          "| humming us | picked vs humming | humming rel err (no clamp) |")
    print("|---" * 18 + "|")
    for r in summary:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]} | {r[4]:.1f} | {r[5]:.2f} | {r[6]} | {r[7]} | {r[8]:.1f} | {r[9]} "
              f"| {r[10]:.1f} | {r[11]:.2f}x | {r[12]} | {r[13]} | {r[14]} | {r[15]} | {r[16]} | {r[17]} |")
    if bad:  # a speed figure of a wrong result is no figure
        print("moe_few_tokens: relative error above 1e-2 against the fp32 twin:\n  " + "\n  ".join(bad))
        return 1
    return 0


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out.float() - ref).norm() / ref.norm()).item()


if __name__ == "__main__":
    raise SystemExit(main())
