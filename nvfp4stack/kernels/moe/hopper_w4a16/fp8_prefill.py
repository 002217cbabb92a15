"""FP8-compute prefill mode of the ``triton_w4a16`` MoE backend.

Hopper has FP8 tensor cores but no FP4 ones, and at large loads the W4A16 kernel is MMA bound
(bench/moe_kernel_notes.md). This mode re-quantizes the NVFP4 experts once, at load, to FP8 E4M3
with one fp32 scale per output row (global scale x power of two), as ``torch._scaled_grouped_mm``
takes them on sm90 (row-wise: [E, N] for the weights, [M] for the activations), quantizes
activations per token on the fly, and runs both grouped GEMMs in FP8:

  x[T,H] -> sort/pad slots by expert, gather + fp8 rows -> L1 (w1|w3) -> clamped SwiGLU + fp8
    rows -> L2 (w2) -> weighted top-k sum per token (fp32)
The three elementwise stages are one Triton pass each (_fp8_prefill_kernels.py); on CPU they run
as the torch functions here, which are also their reference.

Memory: 1 byte per weight + 4 bytes per output row, on top of the NVFP4 copy (0.5625 B/weight)
that decode keeps using: 1.5625 B/weight in all, against 2 for bf16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from nvfp4stack.formats.fp8_block import AMAX_FLOOR, E4M3_MAX, quantize_fp8_block
from nvfp4stack.formats.nvfp4 import Nvfp4Tensor, dequantize_nvfp4
from nvfp4stack.kernels.moe.hopper_w4a16.routing_triton import align_routing
from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import clamped_swiglu

MODES = ("auto", "w4a16", "fp8")
# "auto" switches to FP8 at this many routed rows per expert (average). Measured on an H200
# (bench/RESULTS.md): W4A16 wins at <= 16 (Pro 681 vs 896 us), FP8 from 64 (Pro 944 vs
# 1161 us, Flash 458 vs 505 us); 17..63 was not measured, so the switch sits at the first load seen won.
FP8_MIN_ROWS_PER_EXPERT = 64
# Each expert's rows are padded to 16 (zero rows). torch 2.11 also accepted group ends off that
# grid (probe in device_run.sh) but only the padded layout was timed.
ROW_ALIGN = 16


@dataclass(frozen=True)
class Fp8ExpertWeights:
    """FP8 copy of the stacked experts. w13: e4m3 [E, 2I, H], w13_scale: fp32 [E, 2I];
    w2: e4m3 [E, H, I], w2_scale: fp32 [E, H]. Row r of expert e is data * scale[e, r]."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w13, self.w13_scale, self.w2, self.w2_scale))


def _rows_fp8(w: Nvfp4Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 [E, N, K] -> (e4m3 [E, N, K], fp32 [E, N]), one rounding to E4M3.

    The row scale is the expert's global scale times a power of two (fp8_block's UE8M0 recipe on
    e2m1 * block_scale): scaling by a power of two is exact, so the E4M3 code keeps every
    e2m1 * e4m3 product that fits 4 significant bits (2/3 of the weights on random data, 2.1%
    RMS error) where an arbitrary fp32 row scale re-rounds nearly all of them (14%, 2.8%).
    """
    n, k = w.shape[1], w.shape[2]
    gs = w.global_scale.to(torch.float32).reshape(-1)
    one = torch.ones((), dtype=torch.float32, device=w.data.device)
    data, scale = [], []
    for e in range(w.shape[0]):  # one expert at a time: the fp32 copy of all of them may not fit
        codes = dequantize_nvfp4(w.data[e], w.scale[e], one, torch.float32)  # e2m1 * block scale
        q = quantize_fp8_block(codes, ue8m0=True, block=(1, k), name=f"{name}[{e}]")
        data.append(q.data)
        scale.append(q.scale_float().reshape(n) * gs[e if gs.numel() > 1 else 0])
    return torch.stack(data), torch.stack(scale)


def prepare_fp8_experts(w13: Nvfp4Tensor, w2: Nvfp4Tensor) -> Fp8ExpertWeights:
    """Once at load: FP8 row-scaled copies of the NVFP4 expert weights (same device); only
    worth it where the FP8 GEMM runs (sm90+). ~0.2 s for 32 experts of the bench "flash" shape
    (H 4096, I 2048) on an H200."""
    a, sa = _rows_fp8(w13, "w13")
    b, sb = _rows_fp8(w2, "w2")
    return Fp8ExpertWeights(a, sa, b, sb)


def select_mode(mode: str, rows_per_expert: float, fp8: Fp8ExpertWeights | None) -> str:
    """'w4a16' or 'fp8' for one call. 'auto' takes FP8 only when its weights were prepared."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, found {mode!r}")
    if mode == "fp8" and fp8 is None:
        raise ValueError(
            "mode='fp8': no FP8 expert weights given (fp8_weights=None); build them once at load "
            "with fp8_prefill.prepare_fp8_experts(w13, w2), or use mode='w4a16'"
        )
    if mode == "auto":
        return "fp8" if fp8 is not None and rows_per_expert >= FP8_MIN_ROWS_PER_EXPERT else "w4a16"
    return mode


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row (per-token) E4M3: ([M, K] e4m3, [M] fp32 scales).

    The same numbers as ``quantize_fp8_block(x, ue8m0=False, block=(1, K))`` (tested), without
    its finiteness check: that one syncs the host, and rows past the last group may hold garbage.
    """
    sf = x.abs().amax(dim=1, keepdim=True).float().clamp(min=AMAX_FLOOR) / E4M3_MAX  # [M, 1]
    return (x.float() * (1.0 / sf)).to(torch.float8_e4m3fn), sf.reshape(-1)


def scaled_grouped_mm_reference(a, b, scale_a, scale_b, offs, out_dtype=torch.bfloat16):
    """What ``torch._scaled_grouped_mm`` computes for 2-D a [M, K] x 3-D b [E, K, N] (fp32 math);
    rows past offs[-1] are left zero. For CPU tests of the FP8 path's plumbing."""
    out = torch.zeros(a.shape[0], b.shape[2], dtype=out_dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        af = a[start:end].float() * scale_a[start:end, None]
        out[start:end] = (af @ (b[e].float() * scale_b[e][None, :])).to(out_dtype)
        start = end
    return out


def _expert_offsets(expert_ids: torch.Tensor, num_experts: int, block_m: int) -> torch.Tensor:
    """int32 [E] end row of each expert's padded run, from the per-block expert ids (no sync)."""
    valid = (expert_ids >= 0).to(torch.int64)
    blocks = torch.zeros(num_experts, dtype=torch.int64, device=expert_ids.device)
    blocks.scatter_add_(0, expert_ids.clamp(min=0).to(torch.int64), valid)
    return (torch.cumsum(blocks, 0) * block_m).to(torch.int32)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def gather_quant_rows(x: torch.Tensor, tok: torch.Tensor, poison: bool = False):
    """Rows x[tok] ([P] ids; id >= T gives a zero row) as per-row E4M3: ([P, H], [P] fp32)."""
    if not x.is_cuda:
        x_pad = torch.cat([x, x.new_zeros(1, x.shape[1])])
        return quantize_rows_fp8(x_pad[tok.clamp(max=x.shape[0]).to(torch.int64)])
    from nvfp4stack.kernels.moe.hopper_w4a16._fp8_prefill_kernels import gather_quant_rows_kernel

    rows, k = tok.numel(), x.shape[1]
    q = torch.empty(rows, k, dtype=torch.float8_e4m3fn, device=x.device)
    # fp32 named: vLLM builds (and our warm-up runs) the model under a bf16 default dtype
    s = torch.full((rows,), float("nan"), dtype=torch.float32, device=x.device) if poison else torch.empty(rows, dtype=torch.float32, device=x.device)
    gather_quant_rows_kernel[(rows,)](
        x, x.stride(0), tok, x.shape[0], q, q.stride(0), s, k,
        AMAX_FLOOR=AMAX_FLOOR, FP8_MAX=E4M3_MAX, BLOCK=_pow2(k), num_warps=8,
    )
    return q, s


def swiglu_quant_rows(h: torch.Tensor, swiglu_limit: float | None, poison: bool = False):
    """h [P, 2I] (gate | up) -> per-row E4M3 of the clamped SwiGLU ([P, I], [P]), fp32 math."""
    if not h.is_cuda:
        return quantize_rows_fp8(clamped_swiglu(h.float(), swiglu_limit))
    from nvfp4stack.kernels.moe.hopper_w4a16._fp8_prefill_kernels import swiglu_quant_rows_kernel

    rows, inter = h.shape[0], h.shape[1] // 2
    q = torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=h.device)
    # fp32 named: vLLM builds (and our warm-up runs) the model under a bf16 default dtype
    s = torch.full((rows,), float("nan"), dtype=torch.float32, device=h.device) if poison else torch.empty(rows, dtype=torch.float32, device=h.device)
    swiglu_quant_rows_kernel[(rows,)](
        h, h.stride(0), q, q.stride(0), s, inter,
        float(swiglu_limit) if swiglu_limit is not None else 0.0, HAS_LIMIT=swiglu_limit is not None,
        AMAX_FLOOR=AMAX_FLOOR, FP8_MAX=E4M3_MAX, BLOCK=_pow2(inter), num_warps=8,
    )
    return q, s


def combine_topk(y: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor, out_dtype, poison=False):
    """out[t] = sum_j weights[t, j] * y[pos[t, j]] in fp32; y [P, H], pos/weights [T, k]; pos -1: skipped."""
    if not y.is_cuda:
        rows = y[pos.clamp(min=0).to(torch.int64)].float() * weights.float()[..., None]
        return torch.where((pos >= 0)[..., None], rows, 0.0).sum(1).to(out_dtype)
    from nvfp4stack.kernels.moe.hopper_w4a16._fp8_prefill_kernels import combine_topk_kernel

    tokens, top_k = pos.shape
    hidden = y.shape[1]
    fill = torch.full if poison else (lambda size, _v, **kw: torch.empty(size, **kw))
    out = fill((tokens, hidden), float("nan"), dtype=out_dtype, device=y.device)
    block = 1024
    combine_topk_kernel[(tokens, -(-hidden // block))](
        y, y.stride(0), pos.contiguous(), weights.float().contiguous(), out, out.stride(0), hidden,
        TOP_K=top_k, BLOCK=block, num_warps=4,
    )
    return out


def fp8_moe_forward(
    x: torch.Tensor,
    fp8: Fp8ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
    poison: bool = False,
    grouped_mm: Callable | None = None,
) -> torch.Tensor:
    """Same function as nvfp4_moe_forward, weights and activations in E4M3.

    ``grouped_mm`` defaults to ``torch._scaled_grouped_mm`` (CUDA sm90+); tests pass
    ``scaled_grouped_mm_reference`` to run the same plumbing on CPU (the elementwise stages then
    run as torch ops, on CUDA as the Triton kernels of _fp8_prefill_kernels). ``poison`` fills
    the scale and output buffers with NaN, so that a row nobody wrote shows up in the output.
    """
    num_experts = fp8.w13.shape[0]
    tokens, top_k = topk_ids.shape
    if tokens == 0:
        return torch.zeros_like(x)
    if grouped_mm is None and x.is_cuda and torch.cuda.get_device_capability(x.device) < (9, 0):
        raise ValueError(
            f"fp8 mode: torch._scaled_grouped_mm needs sm90 or later, found "
            f"sm{''.join(map(str, torch.cuda.get_device_capability(x.device)))}; use mode='w4a16'"
        )
    gmm = grouped_mm or torch._scaled_grouped_mm
    routing = align_routing(topk_ids, num_experts, ROW_ALIGN)
    offs = _expert_offsets(routing.expert_ids, num_experts, ROW_ALIGN)
    # padded slots carry the sentinel T*k -> token id T: read as a zero row
    tok = (routing.sorted_ids // top_k).to(torch.int32)  # [P]
    xq, xs = gather_quant_rows(x.to(torch.bfloat16).contiguous(), tok, poison)  # [P, H]
    h = gmm(xq, fp8.w13.transpose(1, 2), xs, fp8.w13_scale, offs=offs, out_dtype=torch.bfloat16)  # [P, 2I]
    hq, hs = swiglu_quant_rows(h, swiglu_limit, poison)  # [P, I]
    y = gmm(hq, fp8.w2.transpose(1, 2), hs, fp8.w2_scale, offs=offs, out_dtype=torch.bfloat16)  # [P, H]
    # padded row of every slot; the sentinel slots land on the dropped extra entry, the slots of negative
    # ids (another rank's experts: in no block) keep -1, which the combine skips
    pos = torch.full((tokens * top_k + 1,), -1, dtype=torch.int32, device=x.device)
    pos[routing.sorted_ids.to(torch.int64)] = torch.arange(tok.numel(), dtype=torch.int32, device=x.device)
    return combine_topk(y, pos[:-1].view(tokens, top_k), topk_weights, x.dtype, poison)


def fp8_moe_forward_emulated(
    x: torch.Tensor,
    fp8: Fp8ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    swiglu_limit: float | None = None,
) -> torch.Tensor:
    """Pure-torch oracle of the FP8 path, expert by expert: fp32 math on the E4M3 values the MMA
    gets, GEMM outputs rounded to bf16 as _scaled_grouped_mm stores them, so that only the
    accumulation order differs."""
    tokens, top_k = topk_ids.shape
    out = torch.zeros(tokens, x.shape[1], dtype=torch.float32, device=x.device)
    flat_ids, flat_w = topk_ids.reshape(-1), topk_weights.reshape(-1).float()
    bf16 = torch.bfloat16
    for e in torch.unique(flat_ids).tolist():
        slots = (flat_ids == e).nonzero().squeeze(1)
        xq, xs = quantize_rows_fp8(x[slots // top_k].to(bf16))
        w13 = fp8.w13[e].float() * fp8.w13_scale[e][:, None]  # [2I, H]
        h = ((xq.float() * xs[:, None]) @ w13.T).to(bf16).float()  # [n, 2I]
        hq, hs = quantize_rows_fp8(clamped_swiglu(h, swiglu_limit))  # [n, I]
        w2 = fp8.w2[e].float() * fp8.w2_scale[e][:, None]  # [H, I]
        y = ((hq.float() * hs[:, None]) @ w2.T).to(bf16).float()  # [n, H]
        out.index_add_(0, slots // top_k, y * flat_w[slots, None])
    return out.to(x.dtype)


def check_fp8_matches(fp8: Fp8ExpertWeights, w13: Nvfp4Tensor, w2: Nvfp4Tensor) -> None:
    """The FP8 copy must belong to these NVFP4 weights (same [E, N, K])."""
    for name, q, src in (("w13", fp8.w13, w13), ("w2", fp8.w2, w2)):
        if tuple(q.shape) != tuple(src.shape):
            raise ValueError(
                f"fp8_weights.{name}: expected shape {tuple(src.shape)} (the NVFP4 {name}), found "
                f"{tuple(q.shape)}; rebuild with prepare_fp8_experts(w13, w2)"
            )
