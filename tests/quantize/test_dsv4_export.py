"""modelopt-DSV4-layout export from explicit amax (no calibration): spec, bit-exactness, sharing."""
from __future__ import annotations

import json
import random

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.models.deepseek_v4 import calib_state as cs
from nvfp4stack.models.deepseek_v4.export import CalibratedExperts, export_dsv4
from nvfp4stack.models.deepseek_v4.tiny import layout_dir
from tests.support import modelopt_dsv4_spec as spec


@pytest.fixture(scope="module")
def seed():
    s = random.SystemRandom().randrange(2**31)
    print(f"seed={s}")
    return s


@pytest.fixture(scope="module")
def amax(root, seed):
    """Weight amax for half the experts (the rest are synthesized), random input amax for all."""
    g = torch.Generator().manual_seed(seed)
    src = ShardedReader(layout_dir(root, "bf16"))
    out = {}
    for n in src.names():
        if ".ffn.experts." in n and n.startswith("layers."):
            path = n[: -len(".weight")]
            block, rest = path.split(".ffn.experts.")
            e, proj = rest.split(".")
            if int(e) % 2 == 0:
                out[cs.amax_key(block, int(e), proj, "weight")] = src.get(n).float().abs().amax()
            out[cs.amax_key(block, int(e), proj, "input")] = torch.rand((), generator=g) * 20 + 1
    return out


@pytest.fixture(scope="module")
def exported(root, amax, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "q"
    base = ShardedReader(layout_dir(root, "release"))
    make = CalibratedExperts(base, ShardedReader(layout_dir(root, "bf16")), amax)
    export_dsv4(layout_dir(root, "release"), out, make)
    return out, dict(make.stats)


def _header(reader):
    return {n: (i.dtype, i.shape) for n, i in reader.infos.items()}


def test_keys_dtypes_shapes_match_the_modelopt_exporter_spec(root, exported):
    out, stats = exported
    src = ShardedReader(layout_dir(root, "release"))
    got = _header(ShardedReader(out))
    want = spec.expected_tensors(_header(src), quantize_mtp=False)
    assert got == want
    assert stats["experts_quantized"] == 4 * 16 * 3 and stats["weight_amax_synthesized"] > 0
    hfq = json.loads((out / "hf_quant_config.json").read_text())
    assert spec.check_hf_quant_config(hfq, src.names(), quantize_mtp=False) == []
    assert spec.check_config(json.loads((out / "config.json").read_text()),
                             json.loads((layout_dir(root, "release") / "config.json").read_text())) == []
    # spec sanity: the exporter's own behaviour quantizes the MTP experts too
    assert any(n.startswith("mtp.0.ffn.experts.0.w1.weight_scale") for n in spec.expected_tensors(_header(src)))


def test_non_expert_tensors_and_mtp_are_byte_identical(root, exported):
    out = ShardedReader(exported[0])
    src = ShardedReader(layout_dir(root, "release"))
    for n in ("layers.1.attn.wq_a.weight", "layers.1.attn.wq_a.scale", "mtp.0.ffn.experts.3.w1.weight",
              "mtp.0.ffn.experts.3.w1.scale", "layers.0.ffn.gate.tid2eid", "hc_head_fn"):
        assert b"".join(out.iter_raw(n)) == b"".join(src.iter_raw(n)), n


def test_experts_are_modelopt_bit_exact_and_w13_share_global_scales(root, amax, exported):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    out, src = ShardedReader(exported[0]), ShardedReader(layout_dir(root, "bf16"))
    for path in ("layers.0.ffn.experts.2.w1", "layers.1.ffn.experts.5.w3", "layers.3.ffn.experts.9.w2"):
        block, rest = path.split(".ffn.experts.")
        e, proj = rest.split(".")
        if proj == "w2":
            wa = amax.get(cs.amax_key(block, int(e), "w2", "weight"), src.get(path + ".weight").float().abs().amax())
        else:  # w1/w3 share max(amax_w1, amax_w3), synthesized from the weights when uncalibrated
            wa = torch.maximum(*(amax.get(cs.amax_key(block, int(e), p, "weight"),
                                          src.get(f"{block}.ffn.experts.{e}.{p}.weight").float().abs().amax())
                                 for p in ("w1", "w3")))
        s2 = (wa.float() / (6.0 * 448.0)).reshape(())
        q, bs, _ = NVFP4QTensor.quantize(src.get(path + ".weight"), 16, None, s2, try_tensorrt=False)
        assert torch.equal(out.get(path + ".weight"), q._quantized_data), path
        assert torch.equal(out.get(path + ".weight_scale").view(torch.uint8), bs.view(torch.uint8)), path
        assert torch.equal(out.get(path + ".weight_scale_2"), s2), path
    for e in range(16):
        p = f"layers.2.ffn.experts.{e}"
        for suf in (".weight_scale_2", ".input_scale"):
            assert torch.equal(out.get(f"{p}.w1{suf}"), out.get(f"{p}.w3{suf}")), (p, suf)
    p = "layers.2.ffn.experts.4"
    want_in = torch.maximum(amax[cs.amax_key("layers.2", 4, "w1", "input")],
                            amax[cs.amax_key("layers.2", 4, "w3", "input")]) / 2688.0
    assert torch.equal(out.get(p + ".w1.input_scale"), want_in.float())


def test_routed_expert_weight_error_is_below_0_1(root, exported):
    from nvfp4stack.quantize.report import weight_errors

    errs = weight_errors(ShardedReader(exported[0]), ShardedReader(layout_dir(root, "bf16")))
    rel = errs["routed_experts"]["rel_error"]
    print(f"routed-expert NVFP4 weight rel error vs BF16: {rel:.4f} (worst tensor "
          f"{errs['routed_experts']['max_tensor_rel_error']:.4f})")
    assert 0.05 < rel < 0.1
    assert errs["routed_experts"]["formats"] == ["nvfp4"]
    assert errs["attn.wq_b"]["formats"] == ["fp8_block"] and errs["attn.wq_b"]["rel_error"] < 0.05


def test_calib_state_roundtrip_and_validation(tmp_path, amax):
    meta = {"n_amax": len(amax), "source": "x"}
    cs.save_state(tmp_path / "state", amax, meta)
    back, m = cs.load_state(tmp_path / "state")
    assert m == meta and set(back) == set(amax)
    assert all(torch.equal(back[k], amax[k].float()) for k in amax)
    groups = [k.split("_input_quantizer")[0] for k in amax if k.endswith("_input_quantizer._amax")]
    assert cs.validate_state(back, m, groups) == []
    back["layers.0.ffn.experts.0.w1_input_quantizer._amax"] = torch.tensor(float("nan"))
    problems = cs.validate_state(back, m, groups + ["layers.9.ffn.experts.0.w1"])
    assert any("finite" in p for p in problems) and any("layers.9" in p for p in problems)
    with pytest.raises(FileNotFoundError, match="quantize.state_dir"):
        cs.load_state(tmp_path / "nope")


def test_native_amax_from_modelopt_fused_expert_quantizer_names():
    snap = {"model.layers.1.mlp.experts.gate_up_proj_weight_quantizers.3": torch.tensor(2.0),
            "model.layers.1.mlp.experts.down_proj_weight_quantizers.3": torch.tensor(1.5),
            "model.layers.1.mlp.experts.gate_up_proj_input_quantizer": torch.tensor(7.0),
            "model.layers.1.mlp.experts.down_proj_input_quantizer": torch.tensor(9.0),
            "model.layers.1.self_attn.q_a_proj.input_quantizer": torch.tensor(1.0)}
    out = cs.native_amax_from_snapshot(snap, n_experts=4)
    assert float(out["layers.1.ffn.experts.3.w1_weight_quantizer._amax"]) == 2.0
    assert float(out["layers.1.ffn.experts.3.w3_weight_quantizer._amax"]) == 2.0
    assert float(out["layers.1.ffn.experts.3.w2_weight_quantizer._amax"]) == 1.5
    assert float(out["layers.1.ffn.experts.0.w3_input_quantizer._amax"]) == 7.0
    assert float(out["layers.1.ffn.experts.2.w2_input_quantizer._amax"]) == 9.0
    assert len(out) == 3 + 4 * 3
