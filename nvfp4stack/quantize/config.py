"""QuantizeConfig: the ``quantize`` config group (python main.py ... quantize)."""
from __future__ import annotations

from dataclasses import dataclass

METHODS = ("modelopt", "cast")
EXPORT_FORMATS = ("dsv4", "hf_unified")
MTP_MODES = ("copy", "nvfp4")


def _bad(key: str, expected: str, found, fix: str) -> ValueError:
    return ValueError(f"quantize.{key}: expected {expected}, found {found!r}; {fix}")


@dataclass
class QuantizeConfig:
    """How to produce the NVFP4-expert checkpoint.

    method: ``modelopt`` (calibrate the BF16 model with nvidia-modelopt, export) or ``cast``
      (data-free MXFP4 -> NVFP4 of the release's experts, no calibration of weights).
    export_format: ``dsv4`` (modelopt's DeepSeek-V4 layout: release format + NVFP4 routed experts)
      or ``hf_unified`` (modelopt's generic export_hf_checkpoint; method=modelopt only).
    source: BF16 DeepSeek-native checkpoint (layout a): calibration model and expert weights.
    base: release-format checkpoint (layout b) whose non-expert tensors are copied byte for byte.
      Both empty -> taken from the model config (the tiny factory builds both).
    mtp: ``copy`` keeps the MTP block byte for byte; ``nvfp4`` quantizes its routed experts too,
      like modelopt's DSV4 exporter does.
    amax_path: a saved calibration state (calib_state dir) whose activation amax gives the
      input_scale of a cast; cast_input_amax is the explicit data-free alternative. Without
      either, a cast whose plan serves the experts W4A4 calibrates activations on the BF16 source;
      a weight-only (W4A16) target needs no amax and gets a unit placeholder input_scale.
    """

    method: str = "modelopt"
    export_format: str = "dsv4"
    source: str = ""
    base: str = ""
    output_dir: str = ""            # '' -> <run_dir>/quantized
    state_dir: str = ""             # '' -> <run_dir>/calib_state
    calib_samples: int = 64         # corpus texts
    calib_seq_len: int = 128        # tokens per calibration row
    calib_batch_size: int = 4       # rows per forward
    export_only: bool = False
    validate_only: bool = False
    mtp: str = "copy"
    amax_path: str = ""
    cast_input_amax: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise _bad("method", f"one of {', '.join(METHODS)}", self.method, "pick one of those")
        if self.export_format not in EXPORT_FORMATS:
            raise _bad("export_format", f"one of {', '.join(EXPORT_FORMATS)}", self.export_format,
                       "pick one of those")
        if self.mtp not in MTP_MODES:
            raise _bad("mtp", f"one of {', '.join(MTP_MODES)}", self.mtp, "pick one of those")
        if self.method == "cast" and self.export_format != "dsv4":
            raise _bad("export_format", "'dsv4' with method=cast", self.export_format,
                       "hf_unified needs the calibrated modelopt model: use quantize.method=modelopt")
        if self.export_only and self.validate_only:
            raise _bad("export_only", "not both export_only and validate_only", True,
                       "set one of quantize.export_only / quantize.validate_only")
        if self.export_format == "hf_unified" and (self.export_only or self.validate_only):
            raise _bad("export_only", "export_only/validate_only with export_format=dsv4",
                       self.export_format, "the saved amax state re-exports in the dsv4 layout only")
        for key in ("calib_samples", "calib_seq_len", "calib_batch_size"):
            v = getattr(self, key)
            if not isinstance(v, int) or v < 1:
                raise _bad(key, "a positive int", v, "set it to 1 or more")
        if self.cast_input_amax is not None and not self.cast_input_amax > 0:
            raise _bad("cast_input_amax", "a positive float or null", self.cast_input_amax,
                       "give the activation amax, or leave it null and set quantize.amax_path")
