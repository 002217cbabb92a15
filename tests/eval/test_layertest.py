"""Layer test on the tiny DeepSeek-V4: exactness for bf16, the ranking of schemes, and the NVFP4
kernel path against transformers' experts forward with the DSV4 engineer's emulated weights."""
from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch

from nvfp4stack.cli import compose_config
from nvfp4stack.eval.metrics import SQNR_CAP_DB, compare
from nvfp4stack.eval.precision import bf16_checkpoint_dir, eval_precision
from nvfp4stack.eval.prompts import eval_token_ids
from nvfp4stack.models.deepseek_v4.capture import activation_amax, capture, experts_modules
from nvfp4stack.models.deepseek_v4.layertest import experts_metrics, layertest, role_summary

ROOT = Path(__file__).resolve().parents[2]


def compose(*overrides: str):
    return compose_config("recipe=tiny_dsv4", *overrides, "run_dir=/tmp/unused")


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer

    from nvfp4stack.models.deepseek_v4.reference import load_reference

    seed = random.randrange(1, 2**31)
    print(f"seed={seed}")
    cfg = compose()
    ckpt = bf16_checkpoint_dir(cfg)
    model = load_reference(ckpt, torch.float32)
    batches = eval_token_ids(AutoTokenizer.from_pretrained(ckpt), 2, 16, seed)
    return cfg, ckpt, model, capture(model, batches)


def test_bf16_everywhere_is_exact(tiny):
    cfg, ckpt, model, caps = tiny
    res = layertest(model, caps, eval_precision(compose("precision=bf16"), ckpt), "torch_emulation")
    assert {"routed_experts", "attn.wo_a", "shared_experts", "compressor", "head"} <= set(res["roles"])
    for role, r in res["roles"].items():
        assert r["scheme"] == "bf16", role
        assert r["cosine_min"] == pytest.approx(1.0, abs=1e-12) and r["sqnr_db_min"] == SQNR_CAP_DB, role
    assert len(res["experts"]) == 4 and all(e["per_expert"] for e in res["experts"].values())


def test_ranking_bf16_fp8_nvfp4_for_routed_experts(tiny):
    cfg, ckpt, model, caps = tiny
    got = {}
    for scheme in ("bf16", "fp8_block", "nvfp4_w4a16", "nvfp4"):
        ex = experts_metrics(model, caps, eval_precision(compose(f"precision.routed_experts={scheme}"), ckpt),
                             "torch_emulation", layers=("1", "2"))
        per = [m["cosine"] for e in ex.values() for m in e["per_expert"].values()]
        got[scheme] = (min(per), sum(per) / len(per), min(e["layer"]["cosine"] for e in ex.values()))
        if scheme.startswith("nvfp4"):
            assert {e["kernel"] for e in ex.values()} == {"torch_emulation"}
    print("routed experts cosine (min per expert, mean per expert, min per layer):",
          {k: tuple(round(x, 5) for x in v) for k, v in got.items()})
    for a, b in (("bf16", "fp8_block"), ("fp8_block", "nvfp4_w4a16"), ("nvfp4_w4a16", "nvfp4")):
        assert got[a][0] >= got[b][0] and got[a][1] >= got[b][1], (a, b, got)
    assert got["bf16"][0] == pytest.approx(1.0, abs=1e-12)
    # Floors for the tiny model's i.i.d. heavy-tailed weights, whose NVFP4 weight SQNR alone is ~21 dB
    # (cosine ~0.996 per matrix); real checkpoints score higher (see the eval report).
    assert got["fp8_block"][0] > 0.995
    assert got["nvfp4_w4a16"][1] > 0.98
    assert got["nvfp4"][1] > 0.96


@pytest.mark.parametrize("scheme", ["nvfp4_w4a16", "nvfp4"])
def test_kernel_path_matches_transformers_with_emulated_weights(tiny, scheme):
    """torch_emulation's nvfp4_moe_forward (layertest path) == transformers' experts forward after
    reference.apply_emulated_precision (the e2e path): two code paths, one quantization."""
    from nvfp4stack.models.deepseek_v4.reference import apply_emulated_precision

    cfg, ckpt, model, caps = tiny
    prec = eval_precision(compose(f"precision.routed_experts={scheme}"), ckpt)
    q = copy.deepcopy(model)
    apply_emulated_precision(q, prec.scheme_for, act_fake_quant=True, input_amax=activation_amax(model, caps))
    ex = experts_metrics(model, caps, prec, "torch_emulation", layers=("0", "3"))  # hash-routed + noaux_tc
    q_experts = {layer: mod for layer, _, mod in experts_modules(q)}
    for layer, _, mod in experts_modules(model):
        if layer not in ex:
            continue
        hidden, idx, wts = caps.experts_cat(layer)
        with torch.no_grad():
            via_hf, ref = q_experts[layer](hidden, idx, wts), mod(hidden, idx, wts)
        m = compare(ref, via_hf)
        assert m["cosine"] == pytest.approx(ex[layer]["layer"]["cosine"], abs=2e-5), layer
        assert m["sqnr_db"] == pytest.approx(ex[layer]["layer"]["sqnr_db"], abs=0.05), layer


@pytest.mark.parametrize("scheme,floor", [("nvfp4_w4a16", 0.999), ("nvfp4", 0.99)])
def test_issue7_acceptance_routed_experts_from_the_release(tiny, scheme, floor):
    """Issue #7: the layertest for NVFP4 routed experts reports cosine >= 0.999 (W4A16) and >= 0.99
    (W4A4) per expert projection, on the plan's path for V4: the release's MXFP4 experts cast to NVFP4
    (lossless on FP4-QAT weights), real captured activations, static W4A4 input scales. The per-expert
    MLP row (two GEMMs + SwiGLU, two activation quantizations for W4A4) and the modelopt-PTQ path from
    BF16 are printed for the record.

    Measured on eval's own token budget (eval.num_prompts x eval.max_tokens, fresh seed), as
    `main.py eval` reports it: the minimum over modules is a per-module cosine, and with the fixture's
    2 x 16 tokens some experts see 1-3 tokens (W4A4 minimum 0.9913-0.9935 over 12 seeds, 0.978 at
    1 x 8), against 0.9945-0.9948 over 6 seeds at 8 x 64."""
    cfg, ckpt, model, _ = tiny
    from transformers import AutoTokenizer
    seed = random.randrange(1, 2**31)
    print(f"acceptance seed={seed}")
    caps = capture(model, eval_token_ids(AutoTokenizer.from_pretrained(ckpt), cfg.eval.num_prompts,
                                         cfg.eval.max_tokens, seed))
    got = {}
    for source in ("official", "bf16"):
        prec = eval_precision(compose(f"model.source_format={source}", f"precision.routed_experts={scheme}"), ckpt)
        assert prec.weights.source_dir.name == ("release" if source == "official" else "bf16")
        ex = experts_metrics(model, caps, prec, "torch_emulation")
        roles = role_summary({}, ex)
        got[source] = {k: (round(r["cosine_min"], 5), round(r["cosine_mean"], 5)) for k, r in roles.items()}
        assert roles["routed_experts"]["modules"] == 3 * roles["routed_experts.mlp"]["modules"]
        if source == "official":
            assert prec.weights.inexact_blocks == 0
            assert roles["routed_experts"]["cosine_min"] >= floor
    print(f"{scheme} routed experts cosine (min, mean): {got}")
    if scheme == "nvfp4_w4a16":  # the cast adds no error at all
        assert got["official"]["routed_experts.mlp"][0] == pytest.approx(1.0, abs=1e-9)
    assert got["official"]["routed_experts"][1] >= got["bf16"]["routed_experts"][1]


@pytest.mark.gpu
def test_triton_w4a16_path_matches_torch_emulation(tiny):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU for triton_w4a16")
    cfg, ckpt, model, caps = tiny
    prec = eval_precision(compose("precision.routed_experts=nvfp4_w4a16"), ckpt)
    tri = experts_metrics(model, caps, prec, "triton_w4a16")
    emu = experts_metrics(model, caps, prec, "torch_emulation")
    for layer in emu:
        assert tri[layer]["kernel"] == "triton_w4a16"
        assert tri[layer]["layer"]["cosine"] == pytest.approx(emu[layer]["layer"]["cosine"], abs=1e-3)
