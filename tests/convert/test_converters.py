"""Each registered converter against the installed references (modelopt, vLLM)."""
import pytest
import torch
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
from vllm.model_executor.layers.fused_moe.flashinfer_moe_ep import _dequant_mxfp4_ue8m0_gran32
from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype
from vllm.utils import deep_gemm

# vLLM wraps it in torch.compile; the eager original is the same code without a ~50 s compile
per_block_cast_to_fp8 = getattr(deep_gemm.per_block_cast_to_fp8, "__wrapped__", deep_gemm.per_block_cast_to_fp8)

from nvfp4stack.convert import CONVERTERS
from nvfp4stack.formats import quantize_fp8_block, quantize_mxfp4, quantize_nvfp4
from nvfp4stack.schemes import Scheme


def conv(name):
    return CONVERTERS.get(name)()


def vllm_nvfp4(g, dtype=torch.float32):
    return dequantize_to_dtype(g["weight"], g["weight_scale"], g["weight_scale_2"], dtype, 16, swizzle=False)


def test_registry_lists_all_with_schemes():
    want = {"mxfp4_to_nvfp4", "mxfp4_to_bf16", "mxfp4_to_fp8_block", "nvfp4_to_bf16", "nvfp4_to_fp8_block", "bf16_to_fp8_block",
            "fp8_block_to_bf16", "bf16_to_nvfp4", "w13_shared_global_scale", "compressor_fuse"}
    assert want <= set(CONVERTERS.names())
    for n in want:
        assert isinstance(CONVERTERS.get(n).source, Scheme) and isinstance(CONVERTERS.get(n).target, Scheme)


def test_mxfp4_to_nvfp4_exact(seed, make_weights):
    x = make_weights("student_t", (256, 512), torch.Generator().manual_seed(seed))
    m = quantize_mxfp4(x)
    c = conv("mxfp4_to_nvfp4")
    # the release stores int8 data and float8_e8m0fnu scales
    out = c.convert({"weight": m.data.view(torch.int8), "scale": m.scale.view(torch.float8_e8m0fnu)}, "experts.0.w1")
    ref = _dequant_mxfp4_ue8m0_gran32(m.data, m.scale)
    assert c.report["exact_fraction"] == 1.0 and c.report["max_rel_err"] == 0.0 and c.report["inexact_blocks"] == 0
    assert torch.equal(vllm_nvfp4(out, torch.bfloat16).view(torch.int16), ref.view(torch.int16))
    assert out["weight_scale"].dtype == torch.float8_e4m3fn and out["weight_scale_2"].ndim == 0


def test_mxfp4_to_nvfp4_wide_range_reports_loss(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 256, generator=gen)
    x[:8] *= 2.0**30  # 30 binades above the rest: beyond E4M3's 18-binade window
    m = quantize_mxfp4(x)
    c = conv("mxfp4_to_nvfp4")
    out = c.convert({"weight": m.data, "scale": m.scale}, "w")
    r = c.report
    assert 0.0 < r["exact_fraction"] < 1.0 and r["max_rel_err"] > 0
    assert r["inexact_blocks"] == round((1.0 - r["exact_fraction"]) * r["blocks"]) > 0
    ref = m.dequantize(torch.float32)
    got = vllm_nvfp4(out)
    big = torch.zeros_like(ref, dtype=torch.bool)
    big[:8] = True
    assert torch.equal(got[big], ref[big])  # the top rows are represented exactly
    assert (got[~big] - ref[~big]).abs().max() <= ref.abs().max() * 2.0**-9 * 2  # within a scale step


def test_nvfp4_to_bf16_and_fp8(seed, make_weights):
    x = make_weights("outliers", (256, 384), torch.Generator().manual_seed(seed))
    q = quantize_nvfp4(x)
    g = {"weight": q.data, "weight_scale": q.scale, "weight_scale_2": q.global_scale,
         "input_scale": torch.tensor(0.01)}
    out = conv("nvfp4_to_bf16").convert(g, "attn.wq_a")
    assert set(out) == {"weight"}
    assert torch.equal(out["weight"].view(torch.int16), vllm_nvfp4(g, torch.bfloat16).view(torch.int16))
    out = conv("nvfp4_to_fp8_block").convert(g, "attn.wo_a")
    fq, fs = per_block_cast_to_fp8(vllm_nvfp4(g), use_ue8m0=True)
    assert out["scale"].dtype == torch.float8_e8m0fnu
    assert torch.equal(out["weight"].view(torch.uint8), fq.view(torch.uint8))
    assert torch.equal(out["scale"].float(), fs)


def test_mxfp4_to_bf16_and_fp8(seed, make_weights):
    """The release's MXFP4 experts dequantized (the BF16 reference of an experiment) or put on an
    FP8 block kernel: against vLLM's MXFP4 dequantizer and DeepGEMM's FP8 recipe (vLLM's copy)."""
    x = make_weights("student_t", (256, 384), torch.Generator().manual_seed(seed))
    m = quantize_mxfp4(x)
    g = {"weight": m.data.view(torch.int8), "scale": m.scale.view(torch.float8_e8m0fnu)}  # the release's dtypes
    ref = _dequant_mxfp4_ue8m0_gran32(m.data, m.scale)
    out = conv("mxfp4_to_bf16").convert(g, "layers.3.ffn.experts.0.w1")
    assert set(out) == {"weight"} and out["weight"].dtype == torch.bfloat16
    assert torch.equal(out["weight"].view(torch.int16), ref.view(torch.int16))
    out = conv("mxfp4_to_fp8_block").convert(g, "layers.3.ffn.experts.0.w1")
    fq, fs = per_block_cast_to_fp8(ref.float(), use_ue8m0=True)
    assert torch.equal(out["weight"].view(torch.uint8), fq.view(torch.uint8))
    assert torch.equal(out["scale"].float(), fs)


def test_bf16_fp8_roundtrip(seed, make_weights):
    x = make_weights("normal", (300, 260), torch.Generator().manual_seed(seed))
    out = conv("bf16_to_fp8_block").convert({"weight": x}, "attn.wq_b")
    fq, fs = per_block_cast_to_fp8(x, use_ue8m0=True)
    assert torch.equal(out["weight"].view(torch.uint8), fq.view(torch.uint8)) and torch.equal(out["scale"].float(), fs)
    back = conv("fp8_block_to_bf16").convert(out, "attn.wq_b")["weight"]
    assert back.dtype == torch.bfloat16
    assert torch.equal(back, (fq.float() * fs.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :260]).bfloat16())
    # fp32-scale checkpoints (HF weight_scale_inv) read too
    f32 = quantize_fp8_block(x, ue8m0=False)
    back32 = conv("fp8_block_to_bf16").convert({"weight": f32.data, "weight_scale_inv": f32.scale}, "x")["weight"]
    assert torch.equal(back32, f32.dequantize())


def test_bf16_to_nvfp4_matches_modelopt_and_keeps_calibration(seed, make_weights):
    x = make_weights("student_t", (128, 256), torch.Generator().manual_seed(seed))
    out = conv("bf16_to_nvfp4").convert({"weight": x, "input_amax": torch.tensor(5.376)}, "experts.1.w2")
    d, s, s2 = NVFP4QTensor.quantize(x.clone(), 16)
    assert torch.equal(out["weight"], d._quantized_data) and torch.equal(out["weight_scale_2"], s2)
    assert torch.equal(out["weight_scale"].view(torch.uint8), s.view(torch.uint8))
    assert out["input_scale"].item() == pytest.approx(5.376 / 2688)
    assert "input_scale" not in conv("bf16_to_nvfp4").convert({"weight": x}, "w")


def test_w13_from_bf16_uses_max_global_scale(seed, make_weights):
    gen = torch.Generator().manual_seed(seed)
    w1, w3 = make_weights("normal", (64, 128), gen), make_weights("normal", (64, 128), gen) * 3
    c = conv("w13_shared_global_scale")
    out = c.convert({"w1.weight": w1, "w3.weight": w3, "w2.weight": w1[:, :64]}, "layers.0.ffn.experts.5")
    gs = torch.maximum(w1.abs().amax().float(), w3.abs().amax().float()) / 2688
    for p, w in (("w1", w1), ("w3", w3)):
        d, s, s2 = NVFP4QTensor.quantize(w.clone(), 16, weights_scaling_factor_2=gs)
        assert torch.equal(out[f"{p}.weight"], d._quantized_data) and torch.equal(out[f"{p}.weight_scale_2"], gs)
    assert torch.equal(out["w2.weight"], w1[:, :64])  # other modules pass through untouched


def test_w13_from_nvfp4_folds_ratio(seed, make_weights):
    gen = torch.Generator().manual_seed(seed)
    w1, w3 = make_weights("student_t", (64, 256), gen), make_weights("normal", (64, 256), gen)
    q1, q3 = quantize_nvfp4(w1), quantize_nvfp4(w3 * 5)
    g = {}
    for p, q in (("w1", q1), ("w3", q3)):
        g.update({f"{p}.weight": q.data, f"{p}.weight_scale": q.scale, f"{p}.weight_scale_2": q.global_scale,
                  f"{p}.input_scale": torch.tensor(0.5 if p == "w1" else 0.25)})
    c = conv("w13_shared_global_scale")
    out = c.convert(g, "e")
    big, small = ("w1", "w3") if q1.global_scale > q3.global_scale else ("w3", "w1")
    assert torch.equal(out[f"{big}.weight"], g[f"{big}.weight"])  # max side: bytes untouched
    assert torch.equal(out["w1.weight_scale_2"], out["w3.weight_scale_2"])
    assert out["w1.input_scale"].item() == 0.5 and out["w3.input_scale"].item() == 0.5
    old = vllm_nvfp4({k[3:]: v for k, v in g.items() if k.startswith(small)})
    new = vllm_nvfp4({k[3:]: v for k, v in out.items() if k.startswith(small)})
    orig = (w1 if small == "w1" else w3 * 5).float()
    e_old, e_new = (old - orig).norm() / orig.norm(), (new - orig).norm() / orig.norm()
    print(f"re-folded {c.report['requantized_blocks']} blocks; rel err vs bf16 {e_old:.4f} -> {e_new:.4f}")
    assert e_new < 1.5 * e_old  # re-rounding adds a fraction of one quantization's error
    # a power-of-two ratio is absorbed exactly: no block is re-rounded
    q3b = quantize_nvfp4(w3, q1.global_scale * 0.25)
    g2 = {**g, "w3.weight": q3b.data, "w3.weight_scale": q3b.scale, "w3.weight_scale_2": q3b.global_scale}
    c.convert(g2, "e")
    assert c.report["requantized_blocks"] == 0 or (q3b.scale.float() * 0.25 < 2.0**-9).any()


def test_w13_finds_the_gate_up_pair_of_any_family(seed, make_weights):
    from nvfp4stack.convert.w13_shared_global_scale import gate_up_parts

    gen = torch.Generator().manual_seed(seed)
    gate, up = make_weights("normal", (32, 64), gen), make_weights("normal", (32, 64), gen) * 2
    out = conv("w13_shared_global_scale").convert({"gate_proj.weight": gate, "up_proj.weight": up},
                                                   "model.layers.0.mlp.experts.3")
    assert torch.equal(out["gate_proj.weight_scale_2"], out["up_proj.weight_scale_2"])
    assert gate_up_parts({"wu.weight": up, "wg.weight": gate, "wd.weight": gate}, "e", (("wg", "wu"),)) == ("wg", "wu")
    with pytest.raises(KeyError, match=r"e: w13_shared_global_scale needs both projections of one \(gate, up\) "
                                       r"pair \(e\.w1 and e\.w3 or .*found \['w1'\].*gate_up_pairs"):
        gate_up_parts({"w1.weight": gate}, "e")


def test_compressor_fuse_layout(seed):
    gen = torch.Generator().manual_seed(seed)
    wkv, wgate = torch.randn(256, 64, generator=gen).bfloat16(), torch.randn(256, 64, generator=gen).bfloat16()
    out = conv("compressor_fuse").convert({"wkv.weight": wkv, "wgate.weight": wgate}, "layers.2.attn.indexer.compressor")
    assert list(out) == ["fused_wkv_wgate.weight"]
    assert torch.equal(out["fused_wkv_wgate.weight"], torch.cat([wkv, wgate]))
    f = quantize_fp8_block(wkv)
    out = conv("compressor_fuse").convert({"wkv.weight": f.data, "wkv.scale": f.scale, "wgate.weight": wgate}, "c")
    assert torch.equal(out["fused_wkv_wgate.weight"][:256], f.dequantize())
    with pytest.raises(KeyError, match="c.wgate.weight"):
        conv("compressor_fuse").convert({"wkv.weight": wkv}, "c")
