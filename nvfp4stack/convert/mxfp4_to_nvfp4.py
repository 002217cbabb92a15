"""MXFP4 (release-format routed experts) -> NVFP4, data-free and exact wherever possible.

Each MXFP4 block of 32 is two NVFP4 blocks of 16 sharing a power-of-two scale 2^s. With a
power-of-two global scale 2^g, block scale 2^(s-g) is an exact E4M3 value for s-g in [-9, 8],
and the E2M1 codes carry over unchanged. g = s_max - 8 puts the largest block at the top of
that window; blocks more than 17 binades below it are re-rounded from their exact values (the
only lossy case, counted in ``report``).
"""
from __future__ import annotations

import os

import torch

from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import mxfp4_from_group, nvfp4_to_group
from nvfp4stack.formats.e2m1 import e2m1_decode, e2m1_encode, pack_e2m1, unpack_e2m1
from nvfp4stack.formats.mxfp4 import E8M0_BIAS, Mxfp4Tensor
from nvfp4stack.formats.nvfp4 import BLOCK, Nvfp4Tensor
from nvfp4stack.schemes import Scheme

_K_MIN, _K_MAX = -9, 8  # E4M3 holds every power of two in [2^-9, 2^8] exactly
_MAGNITUDE_BITS = 0x7777777777777777  # the 3 magnitude bits of all 16 nibbles in a word
# with TRITON_INTERPRET=1 this runs the Triton path on CPU tensors (CI checks it against torch)
_FORCE = "NVFP4STACK_MX2NV_TRITON"


def _global_exponent(top: torch.Tensor) -> torch.Tensor:
    """g from the top nonzero-block exponent: the largest block lands on 2^8 (``_K_MAX``)."""
    top = torch.where(top < -E8M0_BIAS, torch.full_like(top, _K_MAX), top)  # all-zero tensor
    return (top - _K_MAX).clamp(min=-126)           # stay a normal fp32 number


def _e4m3_pow2(kc: torch.Tensor) -> torch.Tensor:
    """E4M3 2^kc for int32 kc in [-9, 8], from its bits (the Triton kernel's rule): normal down to 2^-6
    (biased exponent kc+7, zero mantissa), then the subnormals 2^-7..2^-9 (mantissa 4, 2, 1). Integer
    ops on the scales only, instead of an fp32 ldexp and a float8 cast."""
    normal = (kc + 7) << 3
    sub = torch.ones_like(kc) << (kc + 9).clamp(min=0, max=2)
    return torch.where(kc >= -6, normal, sub).to(torch.uint8).view(torch.float8_e4m3fn)


def _experts(m: Mxfp4Tensor) -> int:
    return m.shape[0] if len(m.shape) == 3 else 1   # 3-D [E, N, K]: one global scale per expert


def _fast_path(m: Mxfp4Tensor, top: torch.Tensor | None) -> tuple[Nvfp4Tensor, dict] | None:
    """CUDA (or TRITON_INTERPRET=1): two fused Triton passes; None when some block is inexact
    (the torch path then does the re-rounding) or when Triton is missing."""
    try:
        from nvfp4stack.formats import mxfp4_nvfp4_triton as tk
    except ImportError:
        return None
    out, gs, n_inexact = tk.convert_scales(m.data.contiguous(), m.scale.contiguous(), _experts(m),
                                           _K_MIN, _K_MAX, E8M0_BIAS, top=top)
    if n_inexact:
        return None
    gs = gs.reshape(()) if len(m.shape) != 3 else gs
    q = Nvfp4Tensor(m.data, out.view(torch.float8_e4m3fn), gs, m.shape)
    return q, {"blocks": out.numel(), "inexact_blocks": 0, "exact_fraction": 1.0, "max_rel_err": 0.0,
               "mean_rel_err": 0.0}


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda or (os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get(_FORCE) == "1")


def _nonzero_and_exponents(m: Mxfp4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks of 16 with a nonzero code, their UE8M0 exponents), both [..., K/16]. One NVFP4 block
    = 16 codes = 8 packed bytes = one int64: "any nonzero magnitude" is tested on the packed words,
    so exact blocks are never unpacked (their bytes carry over as is)."""
    words = m.data.contiguous().view(torch.int64)
    s = (m.scale.to(torch.int32) - E8M0_BIAS).repeat_interleave(2, -1)
    return (words & _MAGNITUDE_BITS) != 0, s


def _masked_top(nonzero: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    masked = torch.where(nonzero, s, torch.full_like(s, -(1 << 20)))
    return masked.flatten(1).amax(1) if masked.ndim == 3 else masked.amax()


def top_exponents(m: Mxfp4Tensor) -> torch.Tensor:
    """int32 top UE8M0 exponent over the blocks with a nonzero code: one per expert of a 3-D tensor,
    0-dim for 2-D (below every real exponent when all codes are zero). The global scale is 2^(top - 8)."""
    return _masked_top(*_nonzero_and_exponents(m))


def mxfp4_to_nvfp4(m: Mxfp4Tensor, top: torch.Tensor | None = None) -> tuple[Nvfp4Tensor, dict]:
    """Returns the NVFP4 tensor (per-expert global scale for 3-D) and exactness statistics.

    ``top``: the :func:`top_exponents` to take the global scales from, when they are not this tensor's
    own: a tensor-parallel shard passes the whole tensor's (all-reduced, engine/moe_cast_method.py),
    so every rank writes the bytes the offline converter writes for the whole tensor."""
    if len(m.shape) >= 2 and _use_triton(m.data):
        fast = _fast_path(m, top)
        if fast is not None:
            return fast
    nonzero, s = _nonzero_and_exponents(m)                              # [..., K/16]
    g = _global_exponent(_masked_top(nonzero, s) if top is None else top)
    gb = g.reshape(-1, 1, 1) if g.ndim == 1 else g  # broadcast over [..., N, K/16]
    k = s - gb
    kc = k.clamp(_K_MIN, _K_MAX)
    scale = _e4m3_pow2(kc)
    gs = torch.ldexp(torch.ones_like(g, dtype=torch.float32), g)
    exact = (k >= _K_MIN) | ~nonzero
    n_inexact = int((~exact).sum())
    data = m.data
    if n_inexact:
        # exact values code * 2^s, expressed in units of the clamped scale 2^kc * 2^g
        codes = unpack_e2m1(m.data)
        cb = codes.reshape(*codes.shape[:-1], -1, BLOCK)                # [..., K/16, 16]
        shift = torch.ldexp(torch.ones_like(k, dtype=torch.float32), k - kc).unsqueeze(-1)
        requant = e2m1_encode(e2m1_decode(cb) * shift)
        data = pack_e2m1(torch.where(exact.unsqueeze(-1), cb, requant).reshape(codes.shape))
    q = Nvfp4Tensor(data, scale, gs, m.shape)
    report = {"blocks": int(exact.numel()), "inexact_blocks": n_inexact,
              "exact_fraction": 1.0 - n_inexact / max(exact.numel(), 1),
              "max_rel_err": 0.0, "mean_rel_err": 0.0}
    if n_inexact:
        ref, got = m.dequantize(torch.float32), q.dequantize(torch.float32)
        err = (got - ref).abs()
        report["max_rel_err"] = float(err.max() / ref.abs().max().clamp_min(1e-38))
        report["mean_rel_err"] = float(err.mean() / ref.abs().mean().clamp_min(1e-38))
    return q, report


@CONVERTERS.register("mxfp4_to_nvfp4")
class Mxfp4ToNvfp4(Converter):
    """Relative errors: max|d|/max|ref| and mean|d|/mean|ref| over the tensor."""

    source, target = Scheme.MXFP4, Scheme.NVFP4

    def convert(self, tensors: dict, name: str) -> dict:
        q, self.report = mxfp4_to_nvfp4(mxfp4_from_group(tensors, name))
        input_scale = tensors.get("input_scale")
        return nvfp4_to_group(q, input_scale)
