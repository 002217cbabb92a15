"""Fidelity metrics of a quantized output against its reference (all computed in float64)."""
from __future__ import annotations

import math

import torch

SQNR_CAP_DB = 300.0  # an exact match has infinite SQNR; JSON and plots need a finite number


def cosine(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Cosine similarity of the two tensors flattened (1.0 for two all-zero tensors)."""
    a, b = ref.double().flatten(), out.double().flatten()
    na, nb = a.norm(), b.norm()
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float((a @ b) / (na * nb))


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """10 log10(|ref|^2 / |ref - out|^2), capped at SQNR_CAP_DB for an exact match."""
    a, b = ref.double(), out.double()
    signal, noise = float(a.pow(2).sum()), float((a - b).pow(2).sum())
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return -SQNR_CAP_DB
    return min(SQNR_CAP_DB, 10.0 * math.log10(signal / noise))


def max_rel_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    """max |ref - out| / max |ref|: relative to the tensor's range (element-wise ratios explode near 0)."""
    a, b = ref.double(), out.double()
    scale = float(a.abs().max()) if a.numel() else 0.0
    err = float((a - b).abs().max()) if a.numel() else 0.0
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def compare(ref: torch.Tensor, out: torch.Tensor, where: str = "output") -> dict[str, float]:
    """cosine, SQNR (dB) and max relative error of ``out`` against ``ref`` (same shape)."""
    if ref.shape != out.shape:
        raise ValueError(f"{where}: reference shape {tuple(ref.shape)} != quantized shape {tuple(out.shape)}; "
                         "both must come from the same inputs")
    return {"cosine": cosine(ref, out), "sqnr_db": sqnr_db(ref, out), "max_rel_err": max_rel_error(ref, out)}


def next_token_stats(ref_logits: torch.Tensor, q_logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Sums over positions of KL(ref || q), top-1 agreement, and both models' target NLL.

    Args:
        ref_logits, q_logits: [T, V] next-token logits of the same T positions.
        targets: [T] the actual next tokens (for perplexity).
    Returns:
        sums (callers divide by ``positions`` after accumulating prompts).
    """
    lp = torch.log_softmax(ref_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)                       # [T]
    agree = (lp.argmax(-1) == lq.argmax(-1)).double()
    nll_ref = -lp.gather(-1, targets[:, None]).squeeze(-1)
    nll_q = -lq.gather(-1, targets[:, None]).squeeze(-1)
    return {"kl_sum": float(kl.sum()), "kl_max": float(kl.max()), "top1_sum": float(agree.sum()),
            "nll_ref_sum": float(nll_ref.sum()), "nll_q_sum": float(nll_q.sum()), "positions": int(targets.numel())}
