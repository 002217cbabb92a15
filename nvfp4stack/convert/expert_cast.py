"""The release's MXFP4 routed experts -> NVFP4 on stacked tensors, as a MoE layer holds them.

This is the load-time cast (``engine/moe_cast_method.py``): vLLM loads the release's experts into its
own MXFP4 parameters ([E, 2I, H/2] codes with w1's rows before w3's, [E, 2I, H/32] UE8M0 scales;
[E, H, I/2] and [E, H, I/32] for w2), and this turns them into the NVFP4 tensors our kernels take,
on the tensors' device, a chunk of experts at a time. It runs the offline converters' own functions
(``mxfp4_to_nvfp4``, then ``refold_global_scale`` to give w1 and w3 the larger of their two global
scales, as ``w13_shared_global_scale`` does), so every expert gets the bytes ``convert`` /
``quantize.method=cast`` would write for it. A tensor-parallel shard holds part of each expert's
rows (w1/w3) or columns (w2): ``reduce_top`` all-reduces the per-expert top exponents (MAX) so the
global scales are the whole tensor's, as offline.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from nvfp4stack.convert.mxfp4_to_nvfp4 import mxfp4_to_nvfp4, top_exponents
from nvfp4stack.convert.w13_shared_global_scale import refold_global_scale
from nvfp4stack.formats.mxfp4 import Mxfp4Tensor
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor

# Experts cast at once: bounds the temporaries of the (rare) inexact re-rounding, which unpacks codes.
CHUNK = 16
ReduceTop = Optional[Callable[[torch.Tensor], None]]   # in place on an int32 tensor [experts]


def _cast(m: Mxfp4Tensor, reduce_top: ReduceTop) -> tuple[Nvfp4Tensor, int]:
    top = None   # one GPU or EP: mxfp4_to_nvfp4 finds the tops in its own pass over the codes
    if reduce_top is not None:   # TP: the whole tensor's tops, all-reduced, before the scales are made
        top = top_exponents(m).to(torch.int32)      # [e]
        reduce_top(top)
    q, report = mxfp4_to_nvfp4(m, top=top)
    return q, report["inexact_blocks"]


def _mx(codes: torch.Tensor, scales: torch.Tensor) -> Mxfp4Tensor:
    return Mxfp4Tensor(codes, scales, (*codes.shape[:-1], codes.shape[-1] * 2))


def _cast_w13(codes: torch.Tensor, scales: torch.Tensor, reduce_top: ReduceTop) -> tuple[Nvfp4Tensor, dict]:
    """[e, 2I, H/2] w1|w3 -> NVFP4 with one global scale per expert (the max of w1's and w3's)."""
    i = codes.shape[1] // 2
    q1, n1 = _cast(_mx(codes[:, :i], scales[:, :i]), reduce_top)
    q3, n3 = _cast(_mx(codes[:, i:], scales[:, i:]), reduce_top)
    gs = torch.maximum(q1.global_scale, q3.global_scale)
    refolded, requant = [], 0
    for q in (q1, q3):
        r, n = refold_global_scale(q, gs)
        keep = (q.global_scale == gs).reshape(-1, 1, 1)    # an expert already at the max keeps its bytes
        refolded.append((torch.where(keep, q.data, r.data), torch.where(keep, q.scale, r.scale)))
        requant += n
    data = torch.cat([refolded[0][0], refolded[1][0]], 1)
    scale = torch.cat([refolded[0][1], refolded[1][1]], 1)
    shape = (codes.shape[0], 2 * i, codes.shape[-1] * 2)
    return Nvfp4Tensor(data, scale, gs, shape), {"inexact_blocks": n1 + n3, "w13_requantized_blocks": requant}


def cast_stacked_experts(w13_codes: torch.Tensor, w13_scales: torch.Tensor, w2_codes: torch.Tensor,
                         w2_scales: torch.Tensor, reduce_top: ReduceTop = None,
                         chunk: int = CHUNK) -> tuple[Nvfp4Tensor, Nvfp4Tensor, dict]:
    """Stacked MXFP4 experts -> (w13, w2) NVFP4 with per-expert global scales, and counts.

    The codes of exact blocks carry over unchanged; they are written back into ``w13_codes`` /
    ``w2_codes`` (the returned tensors' ``data`` share their storage), so the cast needs no second
    copy of the experts: only the new E4M3 scales (2 bytes per 32 weights) are allocated.
    """
    for name, codes, scales in (("w13", w13_codes, w13_scales), ("w2", w2_codes, w2_scales)):
        if codes.dtype != torch.uint8 or scales.dtype != torch.uint8 or codes.ndim != 3 \
                or tuple(scales.shape) != (*codes.shape[:2], codes.shape[2] * 2 // 32):
            raise ValueError(f"{name}: expected stacked MXFP4 experts, uint8 codes [E, N, K/2] and uint8 UE8M0 "
                             f"scales [E, N, K/32]; found {codes.dtype} {tuple(codes.shape)} and {scales.dtype} "
                             f"{tuple(scales.shape)}. The load-time cast takes vLLM's Mxfp4MoEMethod parameters")
    e = w13_codes.shape[0]
    out = {"w13": [], "w2": []}
    stats = {"experts": e, "inexact_blocks": 0, "w13_requantized_blocks": 0}
    for lo in range(0, e, chunk):
        hi = min(lo + chunk, e)
        q13, s13 = _cast_w13(w13_codes[lo:hi], w13_scales[lo:hi], reduce_top)
        q2, n2 = _cast(_mx(w2_codes[lo:hi], w2_scales[lo:hi]), reduce_top)
        for k, v in s13.items():
            stats[k] += v
        stats["inexact_blocks"] += n2
        w13_codes[lo:hi].copy_(q13.data)   # no-op where the codes carried over (same storage)
        w2_codes[lo:hi].copy_(q2.data)
        out["w13"].append(q13)
        out["w2"].append(q2)

    def stacked(parts: list[Nvfp4Tensor], codes: torch.Tensor) -> Nvfp4Tensor:
        return Nvfp4Tensor(codes, torch.cat([p.scale for p in parts]), torch.cat([p.global_scale for p in parts]),
                           (*codes.shape[:-1], codes.shape[-1] * 2))

    return stacked(out["w13"], w13_codes), stacked(out["w2"], w2_codes), stats
