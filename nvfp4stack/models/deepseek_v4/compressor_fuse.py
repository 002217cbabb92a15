"""Fuse a DeepSeek-V4 compressor's ``wkv`` and ``wgate`` into ``fused_wkv_wgate`` (BF16).

vLLM 0.32 builds ``compressor.fused_wkv_wgate`` as a MergedColumnParallelLinear with output
shards [wkv, wgate] (shard 0 then 1, concatenated along the output dim) and
``quant_config=None``, for both ``attn.compressor`` and ``attn.indexer.compressor``. FP8 block
inputs are dequantized, since the fused layer is always BF16.
"""
from __future__ import annotations

import torch

from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.convert.groups import FP8_SCALE_KEYS, fp8_from_group
from nvfp4stack.schemes import Scheme

PARTS = ("wkv", "wgate")
FUSED = "fused_wkv_wgate"


@CONVERTERS.register("compressor_fuse")
class CompressorFuse(Converter):
    source, target = Scheme.BF16, Scheme.BF16
    spans_modules = True  # gets the compressor's sub-modules: keys 'wkv.weight', 'wgate.weight'

    def convert(self, tensors: dict, name: str) -> dict:
        ws = []
        for p in PARTS:
            g = {k[len(p) + 1:]: v for k, v in tensors.items() if k.startswith(p + ".")}
            if "weight" not in g:
                raise KeyError(f"{name}: compressor_fuse needs {name}.{p}.weight; found {sorted(tensors)}")
            if any(k in g for k in FP8_SCALE_KEYS):
                w = fp8_from_group(g, f"{name}.{p}").dequantize(torch.bfloat16)
            else:
                w = g["weight"].to(torch.bfloat16)
            ws.append(w)
        if ws[0].ndim != 2 or ws[0].shape != ws[1].shape:
            raise ValueError(f"{name}: wkv {tuple(ws[0].shape)} and wgate {tuple(ws[1].shape)} must "
                             "be 2-D [coff*head_dim, hidden] of the same shape to fuse")
        out = {k: v for k, v in tensors.items() if not k.startswith(("wkv.", "wgate."))}
        out[f"{FUSED}.weight"] = torch.cat(ws, 0)                        # [2*coff*head_dim, hidden]
        return out
