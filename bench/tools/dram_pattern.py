"""Device script (not a pytest module): what the decode kernels' weight access pattern can stream.

Usage (repo root, GPU host): python3 bench/tools/dram_pattern.py

Reads the Flash L1 weights' bytes ([64 experts x 4096 rows, 2048 bytes], 537 MB) the way a decode
CTA does, 64 rows at a time, each K step taking C contiguous bytes of every row, and checksums them
(no math): C = 64 (a BK=128 step of NVFP4), 128, 256, then whole tiles contiguous in memory, then
64-byte steps with L2 prefetch hints ahead. L2 is flushed (512 MB written) before every repetition;
the median of five is printed as TB/s, with a device copy as the roofline. Figures: bench/RESULTS.md
(issue #14, tenth pass): 64-byte steps stream at ~2.5 TB/s where 128 bytes reach ~3.7.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def rd(p, out, ROW_STRIDE, STEP_STRIDE, TILE_STRIDE, NSTEPS, R: tl.constexpr, C: tl.constexpr, NS: tl.constexpr):
    pid = tl.program_id(0)
    base = p + pid.to(tl.int64) * TILE_STRIDE
    acc = tl.zeros([R, C // 4], tl.int32)
    offs32 = tl.arange(0, R)[:, None] * (ROW_STRIDE // 4) + tl.arange(0, C // 4)[None, :]
    b32 = base.to(tl.pointer_type(tl.int32), bitcast=True)
    for s in tl.range(0, NSTEPS, num_stages=NS):
        acc ^= tl.load(b32 + offs32 + s * (STEP_STRIDE // 4))
    tl.store(out + pid * R * (C // 4) + tl.arange(0, R)[:, None] * (C // 4) + tl.arange(0, C // 4)[None, :], acc)


@triton.jit
def rd_pf(p, out, ROW_STRIDE, STEP_STRIDE, TILE_STRIDE, NSTEPS, R: tl.constexpr, C: tl.constexpr, NS: tl.constexpr,
          PF: tl.constexpr, AHEAD: tl.constexpr, EVERY: tl.constexpr):
    pid = tl.program_id(0)
    base = p + pid.to(tl.int64) * TILE_STRIDE
    acc = tl.zeros([R, C // 4], tl.int32)
    offs32 = tl.arange(0, R)[:, None] * (ROW_STRIDE // 4) + tl.arange(0, C // 4)[None, :]
    b32 = base.to(tl.pointer_type(tl.int32), bitcast=True)
    rows = base + tl.arange(0, R) * ROW_STRIDE
    for s in tl.range(0, NSTEPS, num_stages=NS):
        if s % EVERY == 0:
            pp = rows + (s + AHEAD) * STEP_STRIDE
            if PF == 1:
                tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [pp], dtype=tl.int32,
                                          is_pure=False, pack=1)
            else:
                tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 256; mov.u32 $0, 0;", "=r,l", [pp],
                                          dtype=tl.int32, is_pure=False, pack=1)
        acc ^= tl.load(b32 + offs32 + s * (STEP_STRIDE // 4))
    tl.store(out + pid * R * (C // 4) + tl.arange(0, R)[:, None] * (C // 4) + tl.arange(0, C // 4)[None, :], acc)


def _median_us(fn, flush, reps: int = 5) -> float:
    """Median device time of ``fn`` over ``reps`` calls, L2 flushed before each (one warm-up call first)."""
    ts = []
    for _ in range(reps + 1):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts[1:])[reps // 2]


def main() -> None:
    dev = "cuda"
    E, N, K = 64, 4096, 4096  # Flash L1 (w13): N = 2I rows of K/2 bytes
    kb, R = K // 2, 64
    nb = E * N * kb
    w = torch.randint(0, 255, (nb + (1 << 20),), dtype=torch.uint8, device=dev)  # + 1 MB: prefetches past the end
    flush = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device=dev)
    tiles = E * N // R
    print(f"{torch.cuda.get_device_name(0)} torch {torch.__version__} triton {triton.__version__}: {nb / 1e6:.0f} MB")
    for name, C in (("rows 64B/step", 64), ("rows 128B/step", 128), ("rows 256B/step", 256),
                    ("tile-contig 4KB", 64), ("tile-contig 8KB", 128)):
        out = torch.empty(tiles * R * C // 4, dtype=torch.int32, device=dev)
        # (row stride, step stride, tile stride): rows of the weight matrix, or R x C tiles stored contiguously
        args = (kb, C, R * kb) if name.startswith("rows") else (C, R * C, R * kb)
        for ns in (2, 4):
            t = _median_us(lambda: rd[(tiles,)](w, out, *args, kb // C, R=R, C=C, NS=ns, num_warps=4), flush)
            print(f"{name:18s} stages {ns}: {t:7.1f} us {nb / t / 1e6:5.2f} TB/s", flush=True)
    C = 64
    out = torch.empty(tiles * R * C // 4, dtype=torch.int32, device=dev)
    for pf, ahead, every, label in ((1, 4, 2, "prefetch.global.L2, 4 steps ahead, every 2 steps"),
                                    (1, 8, 2, "prefetch.global.L2, 8 ahead, every 2"),
                                    (2, 4, 4, "cp.async.bulk.prefetch.L2 256 B, 4 ahead, every 4"),
                                    (2, 8, 4, "cp.async.bulk.prefetch.L2 256 B, 8 ahead, every 4")):
        t = _median_us(lambda: rd_pf[(tiles,)](w, out, kb, C, R * kb, kb // C, R=R, C=C, NS=4, PF=pf, AHEAD=ahead,
                                               EVERY=every, num_warps=4), flush)
        print(f"rows 64B/step + {label}: {t:7.1f} us {nb / t / 1e6:5.2f} TB/s", flush=True)
    dst = torch.empty_like(w)
    t = _median_us(lambda: dst.copy_(w), flush)
    print(f"copy (roofline): {t:.1f} us, {2 * w.numel() / t / 1e6:.2f} TB/s read + write")


if __name__ == "__main__":
    main()
