"""Per-block max |x| along the last dimension, the first pass of every block-scaled quantizer."""
from __future__ import annotations

import torch

from nvfp4stack.formats.e2m1 import _CHUNK_ELEMS

# |x| of an IEEE float is its bit pattern with the sign cleared, and for non-negative floats the
# integer order of the bits is the numeric order: amax over masked integers is exact and needs
# no float abs temporary. Inf and NaN are the patterns >= the Inf pattern.
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def block_amax(x: torch.Tensor, block: int, name: str, fmt: str) -> torch.Tensor:
    """fp32 max |x| per ``block`` along the last dim -> [..., K/block]; raises on NaN/Inf."""
    lead, nb = x.shape[:-1], x.shape[-1] // block
    it = _BITS.get(x.dtype)
    if it is None:  # float64 and others: the plain (slower) formula
        bamax = x.reshape(*lead, nb, block).abs().amax(-1).float()
        finite = bool(torch.isfinite(bamax).all())
    else:
        bits = x.contiguous().view(it).reshape(-1, nb, block)
        rows = bits.shape[0]
        mag = torch.iinfo(it).max
        out = torch.empty(bits.shape[:2], dtype=it, device=x.device)
        # CPU: row chunks through one reused buffer stay in cache (a whole-tensor temporary costs
        # a fresh page per 4 KiB); CUDA: one chunk
        step = max(1, rows if x.is_cuda else _CHUNK_ELEMS // max(1, nb * block))
        buf = torch.empty((min(step, rows), nb, block), dtype=it, device=x.device)
        for r in range(0, rows, step):
            n = min(step, rows - r)
            torch.amax(torch.bitwise_and(bits[r:r + n], mag, out=buf[:n]), -1, out=out[r:r + n])
        inf_bits = torch.tensor(float("inf"), dtype=x.dtype).view(it).item()
        finite = not bool((out >= inf_bits).any())
        bamax = out.view(x.dtype).float().reshape(*lead, nb)
    if not finite:
        raise ValueError(f"{name}: contains NaN or Inf; {fmt} cannot encode them. Fix the source "
                         "tensor (or calibration) before quantizing")
    return bamax
