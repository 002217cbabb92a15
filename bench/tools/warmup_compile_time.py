"""Device script (not a pytest module): how long ``triton_w4a16``'s load-time warm-up (hopper_w4a16/warmup.py) takes
on this host, and how many kernel binaries it asks Triton for: the share of a server's start that compiling our
kernels costs, and what a warm Triton cache saves.

One process, one layer's experts (random NVFP4, tiled as the backend prepares them on sm90, FP8 prefill weights
with ``--fp8``), ``warm_up`` to ``--max-tokens`` (the engine's token budget). Run it twice with the same
``TRITON_CACHE_DIR``: the first run on an empty directory compiles, the second finds every binary on disk. The line
gives the launch configurations, the seconds (and those spent inside ``triton.compiler.compile``), and the binaries
Triton was asked for: once per binary and process, compiled or read from the disk cache.

Usage (repo root, GPU host): TRITON_CACHE_DIR=/tmp/tc python3 bench/tools/warmup_compile_time.py
    [--shape 4096x2048] [--experts 64] [--top-k 6] [--max-tokens 8192] [--fp8] [--limit 10]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="4096x2048", help="hidden x moe_intermediate")
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--fp8", action="store_true", help="with FP8 prefill weights (backend.moe_fp8_prefill)")
    p.add_argument("--limit", type=float, default=None, help="SwiGLU clamp (DeepSeek-V4: 10); none by default")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("warmup_compile_time: needs a CUDA GPU; nothing run")
        return 2
    import triton
    import triton.compiler

    from nvfp4stack.bench.moe_kernel import random_nvfp4_experts
    from nvfp4stack.kernels.moe.hopper_w4a16 import fp8_prefill, tiles
    from nvfp4stack.kernels.moe.hopper_w4a16.warmup import warm_up

    hidden, inter = (int(v) for v in a.shape.split("x"))
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = random_nvfp4_experts(a.experts, 2 * inter, hidden, dev, g)
    w2 = random_nvfp4_experts(a.experts, hidden, inter, dev, g)
    fp8 = fp8_prefill.prepare_fp8_experts(w13, w2) if a.fp8 else None
    t13, t2 = tiles.tile_experts(w13, w2)
    # every binary a JIT launch asks for goes through triton.compiler.compile (JITFunction.create_binder looks it up
    # there when a kernel first runs on a device): count the calls and the time inside them, by kernel
    asked: list[tuple[str, float]] = []
    compile_fn = triton.compiler.compile

    def counted(src, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return compile_fn(src, *args, **kwargs)
        finally:
            asked.append((getattr(src, "name", "?"), time.perf_counter() - t0))

    triton.compiler.compile = counted
    cache = os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache (default)")
    before = sum(len(f) for _, _, f in os.walk(os.environ["TRITON_CACHE_DIR"])) if "TRITON_CACHE_DIR" in os.environ \
        and os.path.isdir(os.environ["TRITON_CACHE_DIR"]) else 0
    start = time.perf_counter()
    counts = warm_up(t13, t2, a.top_k, a.max_tokens, swiglu_limit=a.limit, fp8_weights=fp8, tiled=True)
    took = time.perf_counter() - start
    names = [n for n, _ in asked]
    kinds = {n: names.count(n) for n in sorted(set(names))}
    inside = sum(t for _, t in asked)
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} | cache {cache} "
          f"({before} files before) | {a.shape} E={a.experts} top-{a.top_k} budget {a.max_tokens} fp8={a.fp8} | "
          f"{len(counts)} launch configurations {counts} | {took:.1f} s, {inside:.1f} s of it in triton.compile | "
          f"{len(asked)} binaries asked: {kinds}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
