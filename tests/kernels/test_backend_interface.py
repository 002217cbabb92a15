"""Every registered kernel backend implements the interface of kernels/base.py, and every kernel
nvfp4stack runs agrees with an independent fp32 reference (dequantize with the format's own rules,
written out here, then plain matmuls) on random non-uniform data with ragged routing.

On CPU the torch twin runs; on a GPU host the same test runs every nvfp4stack MoE backend the
device supports (triton_w4a16 there), and tests/kernels/moe/test_triton_w4a16.py compares the
Triton kernel with the twin tile by tile.
"""
import os
from pathlib import Path

import pytest
import torch

from nvfp4stack.arch import detect, resolve
from nvfp4stack.formats.mxfp4 import quantize_mxfp4
from nvfp4stack.formats.nvfp4 import quantize_nvfp4
from nvfp4stack.kernels.base import LINEAR_BACKENDS, MOE_BACKENDS, LinearBackend, MoeBackend, MoeWeights, load_backends
from nvfp4stack.schemes import Scheme

load_backends()
ARCHS = sorted(p.stem for p in (Path(__file__).parents[2] / "conf" / "arch").glob("*.yaml") if p.stem != "auto")
ALL = [(kind, name) for kind, reg in (("moe", MOE_BACKENDS), ("linear", LINEAR_BACKENDS)) for name in reg.names()]
OURS_MOE = [n for n in MOE_BACKENDS.names() if MOE_BACKENDS.get(n).capabilities.provider == "nvfp4stack"]
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def _backend(kind, name):
    return (MOE_BACKENDS if kind == "moe" else LINEAR_BACKENDS).get(name)


def test_registry_holds_both_kinds_and_the_arch_list_is_complete():
    assert {"torch_emulation", "triton_w4a16", "marlin"} <= set(MOE_BACKENDS.names())
    assert {"torch_emulation", "vllm_emulation"} <= set(LINEAR_BACKENDS.names())
    assert "cpu" in ARCHS and "sm90" in ARCHS and "sm100a" in ARCHS
    assert all(resolve(a).name == a for a in ARCHS)


@pytest.mark.parametrize("kind,name", ALL)
def test_backend_implements_the_interface(kind, name):
    be = _backend(kind, name)
    assert issubclass(be, MoeBackend if kind == "moe" else LinearBackend), f"{name}: not a {kind} backend"
    assert be.kind == kind and be.name == name
    assert not be.__abstractmethods__, f"{name}: abstract methods left: {sorted(be.__abstractmethods__)}"


@pytest.mark.parametrize("kind,name", ALL)
def test_is_supported_answers_every_arch_and_scheme(kind, name):
    be = _backend(kind, name)
    for arch in ARCHS:
        for scheme in Scheme:
            verdict = be.is_supported(resolve(arch), scheme)
            assert isinstance(verdict, tuple) and len(verdict) == 2, (name, arch, scheme)
            ok, why = verdict
            assert isinstance(ok, bool) and isinstance(why, str) and why, (name, arch, scheme, verdict)
            if ok:
                assert scheme in be.capabilities.schemes, (name, arch, scheme)


# --- numerics: an independent fp32 reference --------------------------------------------------

def _e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> float64 [..., K]: the even element sits in the low nibble."""
    lo, hi = E2M1[(packed & 0xF).long()], E2M1[(packed >> 4).long()]
    return torch.stack((lo, hi), -1).flatten(-2)


def _ref_nvfp4(w) -> torch.Tensor:
    """NVFP4 [E, N, K] -> float64: e2m1 * block scale (per 16) * global scale (per expert)."""
    vals = _e2m1(w.data.cpu())
    block = w.scale.cpu().double().repeat_interleave(16, -1)
    gs = w.global_scale.cpu().double().reshape(-1)
    gs = gs.reshape(-1, *([1] * (vals.ndim - 1))) if gs.numel() > 1 else gs[0]
    return vals * block * gs


def _ref_mxfp4(w) -> torch.Tensor:
    """MXFP4 [E, N, K] -> float64: e2m1 * 2**(byte - 127) per 32."""
    return _e2m1(w.data.cpu()) * torch.exp2(w.scale.cpu().double() - 127).repeat_interleave(32, -1)


def _ref_moe(x, w13, w2, wts, ids, limit) -> torch.Tensor:
    """Per token, per choice: w2_e(clamped silu(gate) * up) from float64 weights, weighted sum."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    xd, wd, idd = x.cpu().double(), wts.cpu().double(), ids.cpu()
    inter = w2.shape[-1]
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(idd[t, j])
            gate_up = w13[e] @ xd[t]
            gate, up = gate_up[:inter], gate_up[inter:]
            if limit is not None:
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            out[t] += wd[t, j] * (w2[e] @ (gate * torch.sigmoid(gate) * up))
    return out


def _moe_problem(g, device, *, experts=8, hidden=128, inter=64, tokens=37, top_k=3):
    """Heavy-tailed per-row weights, activations large enough for the clamp, ragged routing:
    expert 0 takes most tokens, experts 1 and E-1 none."""
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * torch.rand(experts, 2 * inter, 1, generator=g) * 2
    w13[3, :, :16] *= 50  # one outlier block
    w2 = torch.randn(experts, hidden, inter, generator=g) * torch.rand(experts, hidden, 1, generator=g)
    x = torch.randn(tokens, hidden, generator=g) * 3
    probs = torch.rand(experts, generator=g) + 0.05
    probs[0], probs[1], probs[-1] = 20.0, 0, 0
    ids = torch.stack([torch.multinomial(probs, top_k, generator=g) for _ in range(tokens)]).to(torch.int32)
    wts = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    return [t.to(device) for t in (w13, w2, x, wts, ids)]


def _rel(a, b) -> float:
    return ((a.double().cpu() - b).norm() / b.norm()).item()


def _gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", OURS_MOE)
@pytest.mark.parametrize("limit", [7.0, None])
def test_moe_backend_agrees_with_fp32_reference(name, limit):
    be, arch = MOE_BACKENDS.get(name), detect()
    ok, why = be.is_supported(arch, Scheme.NVFP4_W4A16)
    if not ok:
        pytest.skip(f"{name} on {arch}: {why}")
    device = "cuda" if arch.is_cuda else "cpu"
    w13, w2, x, wts, ids = _moe_problem(_gen(), device)
    q13, q2 = quantize_nvfp4(w13, name="w13"), quantize_nvfp4(w2, name="w2")
    prepared = be.prepare(MoeWeights(q13, q2))
    x_in = x if be.capabilities.emulated else x.bfloat16()  # weight-only GPU kernels take bf16 activations
    got = be.apply(prepared, x_in, wts, ids, swiglu_limit=limit)
    want = _ref_moe(x_in.float(), _ref_nvfp4(q13), _ref_nvfp4(q2), wts, ids, limit)
    assert got.shape == x.shape and got.dtype == x_in.dtype
    err = _rel(got, want)
    print(f"{name} limit={limit}: rel err {err:.2e}")
    assert err <= (1e-5 if be.capabilities.emulated else 1e-2), f"{name}: rel err {err:.2e}"
    if limit is not None:  # the clamp is reached by this data
        assert _rel(got, _ref_moe(x_in.float(), _ref_nvfp4(q13), _ref_nvfp4(q2), wts, ids, None)) > 1e-3
    empty = be.apply(prepared, x_in[:0], wts[:0], ids[:0], swiglu_limit=limit)
    assert empty.shape == (0, x.shape[1])


def test_torch_emulation_runs_mxfp4_experts_like_the_reference():
    be = MOE_BACKENDS.get("torch_emulation")
    w13, w2, x, wts, ids = _moe_problem(_gen(), "cpu", hidden=64, inter=64)
    q13, q2 = quantize_mxfp4(w13, name="w13"), quantize_mxfp4(w2, name="w2")
    got = be.apply(be.prepare(MoeWeights(q13, q2)), x, wts, ids, swiglu_limit=7.0)
    assert _rel(got, _ref_moe(x, _ref_mxfp4(q13), _ref_mxfp4(q2), wts, ids, 7.0)) <= 1e-5


def test_moe_prepare_refuses_what_the_backend_cannot_hold():
    w13, w2, *_ = _moe_problem(_gen(), "cpu", hidden=64, inter=64)
    nv = MoeWeights(quantize_nvfp4(w13), quantize_nvfp4(w2))
    with pytest.raises(ValueError, match="torch_emulation has no FP8 prefill mode"):
        MOE_BACKENDS.get("torch_emulation").prepare(nv, fp8_prefill=True)
    with pytest.raises(ValueError, match="triton_w4a16: w13 is Mxfp4Tensor, expected Nvfp4Tensor"):
        MOE_BACKENDS.get("triton_w4a16").prepare(MoeWeights(quantize_mxfp4(w13), quantize_mxfp4(w2)))
    prepared = MOE_BACKENDS.get("triton_w4a16").prepare(nv, fp8_prefill=True)  # pure torch: CPU builds it
    assert prepared.weights is nv and prepared.fp8.w13.shape == w13.shape


def test_torch_emulation_linear_agrees_with_fp32_reference():
    be = LINEAR_BACKENDS.get("torch_emulation")
    g = _gen()
    w = torch.randn(96, 128, generator=g) * torch.rand(96, 1, generator=g) * 4
    x = torch.randn(2, 5, 128, generator=g)
    bias = torch.randn(96, generator=g)
    q = quantize_nvfp4(w, name="w")
    got = be.apply(be.prepare(q, bias), x)
    want = x.double() @ _ref_nvfp4(q).t() + bias.double()
    assert got.shape == (2, 5, 96) and _rel(got, want) <= 1e-6
    with pytest.raises(TypeError, match="expected a typed container"):
        be.prepare(w)


def test_kernels_name_no_model_family():
    """Kernels know shapes and formats, not model families: no family names or family roles."""
    root = Path(__file__).parents[2] / "nvfp4stack" / "kernels"
    words = ("deepseek", "dsv4", "wo_a", "compressor", "indexer")
    hits = [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in sorted(root.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if any(w in line.lower() for w in words)]
    assert not hits, "\n".join(hits)
