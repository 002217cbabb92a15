"""Fidelity metrics against torch's own definitions, on fresh random data."""
from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from nvfp4stack.eval.metrics import SQNR_CAP_DB, compare, next_token_stats


@pytest.fixture
def gen():
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def test_compare_against_torch_definitions(gen):
    ref = torch.randn(64, 257, generator=gen) * torch.rand(64, 1, generator=gen) * 10
    out = ref + 0.05 * torch.randn(ref.shape, generator=gen)
    m = compare(ref, out)
    assert m["cosine"] == pytest.approx(float(F.cosine_similarity(ref.double().flatten(), out.double().flatten(), dim=0)), abs=1e-12)
    noise = (ref.double() - out.double()).pow(2).sum()
    assert m["sqnr_db"] == pytest.approx(float(10 * torch.log10(ref.double().pow(2).sum() / noise)), rel=1e-12)
    assert m["max_rel_err"] == pytest.approx(float((ref - out).abs().max() / ref.abs().max()), rel=1e-6)
    exact = compare(ref, ref.clone())
    assert exact == {"cosine": pytest.approx(1.0), "sqnr_db": SQNR_CAP_DB, "max_rel_err": 0.0}
    assert compare(ref, -ref)["cosine"] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="layers.3.attn.wq_a"):
        compare(ref, ref[:, :5], "layers.3.attn.wq_a")


def test_next_token_stats_against_torch_kl(gen):
    t, v = 37, 101
    ref, q = torch.randn(t, v, generator=gen) * 3, torch.randn(t, v, generator=gen) * 3
    q[:5] = ref[:5]  # some positions agree exactly
    targets = torch.randint(0, v, (t,), generator=gen)
    s = next_token_stats(ref, q, targets)
    lp, lq = F.log_softmax(ref.double(), -1), F.log_softmax(q.double(), -1)
    want_kl = F.kl_div(lq, lp, log_target=True, reduction="sum")  # KL(ref || q)
    assert s["kl_sum"] == pytest.approx(float(want_kl), rel=1e-9)
    assert s["top1_sum"] == float((ref.argmax(-1) == q.argmax(-1)).sum())
    assert s["top1_sum"] >= 5
    assert s["nll_ref_sum"] == pytest.approx(float(F.cross_entropy(ref.double(), targets, reduction="sum")), rel=1e-9)
    assert s["positions"] == t
    same = next_token_stats(ref, ref, targets)
    assert same["kl_sum"] == pytest.approx(0.0, abs=1e-9) and same["top1_sum"] == t
    assert math.isfinite(s["kl_max"]) and s["kl_max"] > 0
