"""Data-free cast: the release's MXFP4 routed experts -> NVFP4, through the project's converters.

No weight calibration: each expert's MXFP4 (E2M1 + UE8M0/32) becomes NVFP4 via the
``mxfp4_to_nvfp4`` converter, then w1/w3 get one shared global scale via ``w13_shared_global_scale``
(vLLM fuses them into one GEMM). The activation ``input_scale`` cannot come from the weights: it is
taken from a saved calibration state (``quantize.amax_path``), ``quantize.cast_input_amax``, an
activation-only calibration, or (weight-only W4A16 targets) a unit placeholder.
Everything else (FP8 attention, MTP by default) is copied byte for byte by dsv4_export.
"""
from __future__ import annotations

import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.convert.base import CONVERTERS
from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR

MXFP4_TO_NVFP4 = "mxfp4_to_nvfp4"
W13_SHARED = "w13_shared_global_scale"
# A W4A16-only cast still writes input_scale: vLLM creates the parameter for every NVFP4 MoE layer
# (unset bytes if the checkpoint lacks it) and the doctor requires it. amax = 2688 gives exactly
# input_scale 1.0, vLLM's own unit activation scale (per-token mode fills 1.0): finite, positive,
# and never read by weight-only kernels.
W4A16_PLACEHOLDER_AMAX = float(GLOBAL_DIVISOR)


def _converter(name: str):
    import nvfp4stack.convert  # noqa: F401  (the package imports register the converters)

    if name not in CONVERTERS:
        raise KeyError(f"quantize.method=cast needs converter {name!r}, which is not registered "
                       f"(registered: {', '.join(CONVERTERS.names()) or 'none'}); it lives in "
                       "nvfp4stack/convert/")
    return CONVERTERS.get(name)()


class CastExperts:
    """Routed-expert NVFP4 tensors cast from the base's MXFP4, w1/w3 converted as a pair."""

    def __init__(self, base: ShardedReader, input_amax):
        """``input_amax(path) -> 0-dim tensor``: the activation amax of one expert projection."""
        self.base = base
        self.input_amax = input_amax
        self.to_nvfp4 = _converter(MXFP4_TO_NVFP4)
        self.w13 = _converter(W13_SHARED)
        self.stats: dict = {"experts_cast": 0}
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def _cast_one(self, path: str) -> dict[str, torch.Tensor]:
        """{'weight', 'weight_scale', 'weight_scale_2', 'input_scale'} of one projection."""
        group = {"weight": self.base.get(path + ".weight"), "scale": self.base.get(path + ".scale"),
                 "input_scale": (self.input_amax(path).float() / GLOBAL_DIVISOR).reshape(())}
        out = self.to_nvfp4.convert(group, path)
        self.stats["inexact_blocks"] = self.stats.get("inexact_blocks", 0) + self.to_nvfp4.report["inexact_blocks"]
        return out

    def __call__(self, path: str) -> dict[str, torch.Tensor]:
        if path in self._pending:
            out = self._pending.pop(path)
        else:
            head, proj = path.rsplit(".", 1)
            if proj in ("w1", "w3"):
                pair = {f"{p}.{k}": v for p in ("w1", "w3") for k, v in self._cast_one(f"{head}.{p}").items()}
                shared = self.w13.convert(pair, head)  # one weight_scale_2 and input_scale for both
                self.stats["w13_requantized_blocks"] = (self.stats.get("w13_requantized_blocks", 0)
                                                        + self.w13.report["requantized_blocks"])
                split = {p: {k[3:]: v for k, v in shared.items() if k.startswith(p + ".")} for p in ("w1", "w3")}
                other = "w3" if proj == "w1" else "w1"
                self._pending[f"{head}.{other}"] = split[other]
                out = split[proj]
            else:
                out = self._cast_one(path)
        self.stats["experts_cast"] += 1
        return {"." + k: out[k].float().reshape(()) if k in ("weight_scale_2", "input_scale") else out[k]
                for k in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
