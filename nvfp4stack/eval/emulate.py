"""Quantize -> dequantize round trips of weights and activations, for emulated-precision forwards."""
from __future__ import annotations

import torch

from nvfp4stack.formats.fp8_block import quantize_fp8_block
from nvfp4stack.formats.mxfp4 import quantize_mxfp4
from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR, fake_quantize_nvfp4_activation, quantize_nvfp4
from nvfp4stack.schemes import Scheme


def emulate_weight(w: torch.Tensor, scheme: Scheme, name: str,
                   global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``w`` [N, K] after a quantize -> dequantize round trip in ``scheme``, in w's dtype."""
    if scheme in (Scheme.PASSTHROUGH,):
        return w
    if scheme is Scheme.BF16:
        return w.to(torch.bfloat16).to(w.dtype)
    if scheme.is_nvfp4:
        return quantize_nvfp4(w, global_scale, name=name).dequantize(torch.float32).to(w.dtype)
    if scheme is Scheme.MXFP4:
        return quantize_mxfp4(w, name=name).dequantize(torch.float32).to(w.dtype)
    if scheme is Scheme.FP8_BLOCK:
        return quantize_fp8_block(w, ue8m0=True, name=name).dequantize(torch.float32).to(w.dtype)
    raise ValueError(f"{name}: no emulation for scheme {scheme.value!r}")


def fake_quant_act(x: torch.Tensor, amax: float | None, name: str) -> torch.Tensor:
    """NVFP4 activation round trip; global scale from the calibrated amax, else this tensor's own."""
    if x.numel() == 0:
        return x
    a = float(x.detach().abs().amax()) if amax is None else amax
    scale = torch.tensor(max(a, 1e-12) / GLOBAL_DIVISOR, dtype=torch.float32)
    return fake_quantize_nvfp4_activation(x.float(), scale, name=name, dtype=x.dtype)
