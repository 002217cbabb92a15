"""Test data for numerics checks: fresh printed seeds and non-uniform weight distributions."""
from __future__ import annotations

import os

import torch


def fresh_seed(env: str = "NVFP4STACK_SEED") -> int:
    """A new random seed (or ``$NVFP4STACK_SEED`` to replay one), printed and applied to torch."""
    s = int(os.environ.get(env) or int.from_bytes(os.urandom(4), "little"))
    print(f"\n[seed] {s}  (replay: {env}={s})")
    torch.manual_seed(s)
    return s


def random_weights(kind: str, shape, gen: torch.Generator, dtype=torch.bfloat16) -> torch.Tensor:
    """'normal', heavy-tailed 'student_t' (df=2), or 'outliers' (small normal + 1/64 large)."""
    if kind == "normal":
        x = torch.randn(shape, generator=gen)
    elif kind == "student_t":
        z = torch.randn(shape, generator=gen)
        chi2 = torch.randn((*shape, 2), generator=gen).pow(2).sum(-1)
        x = z / torch.sqrt(chi2 / 2).clamp_min(1e-3)
    elif kind == "outliers":
        x = torch.randn(shape, generator=gen) * 0.02
        mask = torch.rand(shape, generator=gen) < 1 / 64
        x = torch.where(mask, torch.randn(shape, generator=gen) * 30, x)
    else:
        raise ValueError(f"random_weights: unknown kind {kind!r}; use normal, student_t or outliers")
    return x.to(dtype)
