"""Throughput of each format quantize/dequantize and converter on the current device (MB/s of
input bytes). Not a test: ``python -m nvfp4stack.bench.formats`` or ``main.py bench bench=formats``."""
from __future__ import annotations

import argparse
import json
import time

import torch

from nvfp4stack.convert import CONVERTERS
from nvfp4stack.convert.groups import nvfp4_to_group
from nvfp4stack.formats import (
    dequantize_fp8_block,
    dequantize_mxfp4,
    quantize_fp8_block,
    quantize_mxfp4,
    quantize_nvfp4,
)


def _timed(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up (allocator, LUT upload, kernel caches)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeats


def _cases(x: torch.Tensor):
    """(name, input bytes, callable) for every quantize/dequant/convert on ``x`` [N, K] bf16."""
    nv, mx, f8 = quantize_nvfp4(x), quantize_mxfp4(x), quantize_fp8_block(x)
    nv_group = nvfp4_to_group(nv)
    mx_group = {"weight": mx.data, "scale": mx.scale}
    conv = {n: CONVERTERS.get(n)() for n in ("mxfp4_to_nvfp4", "nvfp4_to_fp8_block", "bf16_to_fp8_block")}
    bf16 = x.numel() * 2
    return [
        ("nvfp4 quantize (bf16 in)", bf16, lambda: quantize_nvfp4(x)),
        ("nvfp4 dequantize (bf16 out)", nv.nbytes, nv.dequantize),
        ("mxfp4 quantize (bf16 in)", bf16, lambda: quantize_mxfp4(x)),
        ("mxfp4 dequantize (bf16 out)", mx.nbytes, lambda: dequantize_mxfp4(mx.data, mx.scale)),
        ("fp8_block quantize ue8m0 (bf16 in)", bf16, lambda: quantize_fp8_block(x)),
        ("fp8_block dequantize (bf16 out)", f8.nbytes, lambda: dequantize_fp8_block(f8.data, f8.scale)),
        ("convert mxfp4_to_nvfp4", mx.nbytes, lambda: conv["mxfp4_to_nvfp4"].convert(mx_group, "bench")),
        ("convert nvfp4_to_fp8_block", nv.nbytes, lambda: conv["nvfp4_to_fp8_block"].convert(nv_group, "bench")),
        ("convert bf16_to_fp8_block", bf16, lambda: conv["bf16_to_fp8_block"].convert({"weight": x}, "bench")),
    ]


def run(cfg=None) -> list[dict]:
    """cfg.bench may set rows, cols, repeats, threads, device; missing ones take defaults."""
    b = getattr(cfg, "bench", None)
    rows, cols = int(getattr(b, "rows", 4096)), int(getattr(b, "cols", 4096))
    repeats, threads = int(getattr(b, "repeats", 3)), int(getattr(b, "threads", 1))
    device = str(getattr(b, "device", "auto"))
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    if dev.type == "cpu" and threads > 0:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, cols, generator=g) * 0.02).bfloat16().to(dev)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu x{torch.get_num_threads()} thread(s)"
    results = []
    with torch.inference_mode():
        for name, nbytes, fn in _cases(x):
            s = _timed(fn, repeats, dev)
            results.append({"op": name, "device": where, "shape": [rows, cols], "input_bytes": nbytes,
                            "seconds": s, "MB_per_s": nbytes / s / 1e6})
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (0: torch default)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from types import SimpleNamespace

    res = run(SimpleNamespace(bench=args))
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{'op':38s} {'MB/s':>10s}  device")
        for r in res:
            print(f"{r['op']:38s} {r['MB_per_s']:10.1f}  {r['device']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
