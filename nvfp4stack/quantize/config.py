"""QuantizeConfig: the ``quantize`` config group (python main.py ... quantize)."""
from __future__ import annotations

from dataclasses import dataclass

from nvfp4stack.families.registry import families

METHODS = ("modelopt", "cast")
# modelopt's generic export_hf_checkpoint of the calibrated model: every family, method=modelopt only.
HF_UNIFIED = "hf_unified"
MTP_MODES = ("copy", "nvfp4")


def export_formats() -> dict[str, tuple[str, ...]]:
    """export format -> the quantize methods it supports: the families' own layouts, then hf_unified."""
    out = {name: methods for f in families() for name, methods in f.export_formats.items()}
    return out | {HF_UNIFIED: ("modelopt",)}


# The first family layout (the flagship's), else hf_unified.
DEFAULT_EXPORT_FORMAT = next(iter(export_formats()))


def _bad(key: str, expected: str, found, fix: str) -> ValueError:
    return ValueError(f"quantize.{key}: expected {expected}, found {found!r}; {fix}")


@dataclass
class QuantizeConfig:
    """How to produce the NVFP4-expert checkpoint.

    method: ``modelopt`` (calibrate the BF16 model with nvidia-modelopt, export) or ``cast``
      (data-free MXFP4 -> NVFP4 of the release's experts, no calibration of weights).
    export_format: a model family's own layout (``ModelFamily.export_formats``; the flagship's is the
      default) or ``hf_unified`` (modelopt's generic export_hf_checkpoint; method=modelopt only).
    source: BF16 checkpoint in the family's native names: calibration model and expert weights.
    base: release-format checkpoint whose non-expert tensors are copied byte for byte.
      Both empty -> taken from the model config (a tiny factory builds both).
    mtp: ``copy`` keeps the MTP block byte for byte; ``nvfp4`` quantizes its routed experts too.
    amax_path: a saved calibration state (calib_state dir) whose activation amax gives the
      input_scale of a cast; cast_input_amax is the explicit data-free alternative. Without
      either, a cast whose plan serves the experts W4A4 calibrates activations on the BF16 source;
      a weight-only (W4A16) target needs no amax and gets a unit placeholder input_scale.
    """

    method: str = "modelopt"
    export_format: str = DEFAULT_EXPORT_FORMAT
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
        formats = export_formats()
        if self.export_format not in formats:
            raise _bad("export_format", f"one of {', '.join(formats)}", self.export_format,
                       "pick one of those")
        if self.mtp not in MTP_MODES:
            raise _bad("mtp", f"one of {', '.join(MTP_MODES)}", self.mtp, "pick one of those")
        if self.method not in formats[self.export_format]:
            able = [f for f, methods in formats.items() if self.method in methods]
            raise _bad("export_format", f"one of {', '.join(able)} with method={self.method}", self.export_format,
                       f"{self.export_format} supports method={', '.join(formats[self.export_format])}: "
                       "use one of those methods or formats")
        if self.export_only and self.validate_only:
            raise _bad("export_only", "not both export_only and validate_only", True,
                       "set one of quantize.export_only / quantize.validate_only")
        if self.export_format == HF_UNIFIED and (self.export_only or self.validate_only):
            own = [f for f in formats if f != HF_UNIFIED]
            raise _bad("export_only", f"export_only/validate_only with a family layout ({', '.join(own)})",
                       self.export_format, "the saved amax state re-exports in a family's own layout only")
        for key in ("calib_samples", "calib_seq_len", "calib_batch_size"):
            v = getattr(self, key)
            if not isinstance(v, int) or v < 1:
                raise _bad(key, "a positive int", v, "set it to 1 or more")
        if self.cast_input_amax is not None and not self.cast_input_amax > 0:
            raise _bad("cast_input_amax", "a positive float or null", self.cast_input_amax,
                       "give the activation amax, or leave it null and set quantize.amax_path")
