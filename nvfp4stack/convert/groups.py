"""Checkpoint tensor groups <-> typed format containers, for the converters.

Group keys follow the checkpoints we read and write, as the storage codecs in formats/*_codec.py
list them: NVFP4 (modelopt export) ``weight``, ``weight_scale``, ``weight_scale_2``,
``input_scale``; MXFP4 and FP8 block (release format) ``weight`` + ``scale`` (HF FP8 exports
call it ``weight_scale_inv``).
"""
from __future__ import annotations

import torch

from nvfp4stack.formats.codec import require
from nvfp4stack.formats.fp8_block import Fp8BlockTensor
from nvfp4stack.formats.fp8_block_codec import SCALE_KEYS as FP8_SCALE_KEYS
from nvfp4stack.formats.mxfp4 import Mxfp4Tensor, as_ue8m0_bytes
from nvfp4stack.formats.nvfp4 import GLOBAL_DIVISOR, Nvfp4Tensor

_PACKED_DTYPES = (torch.uint8, torch.int8) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2") else ())


def packed_bytes(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dtype not in _PACKED_DTYPES:
        raise ValueError(f"{name}: expected packed E2M1 bytes (uint8/int8), found {t.dtype}")
    return t.view(torch.uint8)


def nvfp4_from_group(t: dict, name: str) -> Nvfp4Tensor:
    require(t, ("weight", "weight_scale", "weight_scale_2"), name, "NVFP4")
    data = packed_bytes(t["weight"], f"{name}.weight")
    gs = t["weight_scale_2"].float().reshape(())
    if not torch.isfinite(gs):
        raise ValueError(f"{name}.weight_scale_2: expected a finite positive global scale, found {gs.item()}; "
                         "the checkpoint is damaged: re-export this layer (quantize.export_only=true)")
    try:
        return Nvfp4Tensor(data, t["weight_scale"], gs, (*data.shape[:-1], data.shape[-1] * 2))
    except ValueError as e:  # the container names its own field; say which checkpoint tensor it was
        raise ValueError(f"{name}: {e}") from None


def nvfp4_to_group(q: Nvfp4Tensor, input_scale: torch.Tensor | None = None) -> dict:
    out = {"weight": q.data, "weight_scale": q.scale, "weight_scale_2": q.global_scale}
    if input_scale is not None:
        out["input_scale"] = input_scale.float().reshape(())
    return out


def mxfp4_from_group(t: dict, name: str) -> Mxfp4Tensor:
    require(t, ("weight", "scale"), name, "MXFP4")
    data = packed_bytes(t["weight"], f"{name}.weight")
    return Mxfp4Tensor(data, as_ue8m0_bytes(t["scale"], f"{name}.scale"),
                       (*data.shape[:-1], data.shape[-1] * 2))


def fp8_scale_key(t: dict, name: str) -> str:
    for k in FP8_SCALE_KEYS:
        if k in t:
            return k
    raise KeyError(f"{name}: FP8 block group needs {name}.scale or {name}.weight_scale_inv; "
                   f"found {sorted(t)}")


def fp8_from_group(t: dict, name: str, block: tuple[int, int] = (128, 128)) -> Fp8BlockTensor:
    """The FP8 block group's stored tensors (weight + its scale, under either name) as one typed
    tensor of views: UE8M0 scales as their bytes, fp32 ones as float."""
    require(t, ("weight",), name, "FP8 block")
    key = fp8_scale_key(t, name)
    scale = t[key]
    ue8m0 = scale.dtype in (torch.uint8, torch.float8_e8m0fnu)
    scale = as_ue8m0_bytes(scale, f"{name}.{key}") if ue8m0 else scale.float()
    return Fp8BlockTensor(t["weight"], scale, ue8m0, tuple(t["weight"].shape), tuple(block))


def fp8_to_group(q: Fp8BlockTensor, scale_key: str = "scale") -> dict:
    # vLLM's UE8M0 FP8 linears register e8m0fnu scale params and copy_() numerically, so UE8M0
    # bytes must be written as float8_e8m0fnu, never as uint8.
    scale = q.scale.view(torch.float8_e8m0fnu) if q.ue8m0 else q.scale
    return {"weight": q.data, scale_key: scale}


def high_precision_weight(t: dict, name: str) -> torch.Tensor:
    require(t, ("weight",), name, "bf16")
    w = t["weight"]
    if not w.is_floating_point() or w.dtype.itemsize == 1:
        raise ValueError(f"{name}.weight: expected bf16/fp16/fp32, found {w.dtype}; pick the "
                         "converter for its actual format (fp8_block_to_bf16, nvfp4_to_bf16, ...)")
    return w


def input_scale_of(t: dict) -> torch.Tensor | None:
    """Calibrated activation scale: ``input_scale`` as is, or ``input_amax`` / 2688."""
    if "input_scale" in t:
        return t["input_scale"].float().reshape(())
    if "input_amax" in t:
        return t["input_amax"].float().reshape(()) / GLOBAL_DIVISOR
    return None
