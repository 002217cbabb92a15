"""Quantize -> dequantize round trips of weights and activations, for emulated-precision forwards."""
from __future__ import annotations

import torch

from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR, fake_quantize_nvfp4_activation
from nvfp4stack.schemes import Scheme


def emulate_weight(w: torch.Tensor, scheme: Scheme, name: str,
                   global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``w`` [N, K] after a quantize -> dequantize round trip in ``scheme``'s storage, in w's dtype."""
    return scheme.codec.emulate(w, name, global_scale).to(w.dtype)


def fake_quant_act(x: torch.Tensor, amax: float | None, name: str) -> torch.Tensor:
    """NVFP4 activation round trip; global scale from the calibrated amax, else this tensor's own."""
    if x.numel() == 0:
        return x
    a = float(x.detach().abs().amax()) if amax is None else amax
    scale = torch.tensor(max(a, 1e-12) / GLOBAL_DIVISOR, dtype=torch.float32)
    return fake_quantize_nvfp4_activation(x.float(), scale, name=name, dtype=x.dtype)
