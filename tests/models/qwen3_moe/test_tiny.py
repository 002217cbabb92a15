"""The tiny Qwen3-MoE factory, its modelopt NVFP4 export, the family's doctor checks and reference forward."""
import json
import math
import random
from types import SimpleNamespace

import pytest
import torch

from nvfp4stack.models.qwen3_moe import FAMILY
from nvfp4stack.models.qwen3_moe.tiny import TinyQwen3MoeSpec, build_tiny_qwen3_moe, ensure_tiny_qwen3_moe
from nvfp4stack.plan.groups import checkpoint_tensors, group_name
from nvfp4stack.schemes import Scheme


@pytest.mark.parametrize("field,value,match", [
    ("head_dim", 16, "head_dim: expected a multiple of 32"),
    ("hidden_size", 200, "hidden_size: expected a multiple of 64"),
    ("moe_intermediate_size", 96, "moe_intermediate_size: expected a multiple of 64"),
    ("num_key_value_heads", 3, "num_attention_heads: expected a multiple of num_key_value_heads=3"),
    ("num_experts_per_tok", 9, "num_experts_per_tok: expected between 1 and num_experts=8"),
])
def test_spec_rejects_what_vllm_cpu_or_nvfp4_cannot_run(field, value, match):
    with pytest.raises(ValueError, match=match):
        TinyQwen3MoeSpec(**{field: value})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from nvfp4stack.quantize.modelopt_ptq import quantize_and_export

    root = tmp_path_factory.mktemp("tiny_qwen3_moe")
    spec = TinyQwen3MoeSpec(num_hidden_layers=2, vocab_size=512, seed=random.randrange(2**16))
    print(f"spec seed={spec.seed}")
    bf16 = build_tiny_qwen3_moe(root / "bf16", spec)
    nvfp4 = quantize_and_export(bf16, root / "nvfp4", "NVFP4_EXPERTS_ONLY_CFG", num_samples=4, max_len=32, seed=1)
    return spec, bf16, nvfp4


def _groups(ckpt):
    out = {}
    for name, info in checkpoint_tensors(ckpt).items():
        g, suf = group_name(name)
        out.setdefault(g, {})[suf or "weight"] = info
    return out


@pytest.mark.slow
def test_build_is_a_qwen3_moe_the_spec_describes(built):
    spec, bf16, _ = built
    cfg = json.loads((bf16 / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert cfg["norm_topk_prob"] is True and cfg["num_experts_per_tok"] == 2 and cfg["head_dim"] == 64
    # every tensor the family's config-only spec lists is in the checkpoint, with that shape, and nothing else
    stored = _groups(bf16)
    expected = {g.name: g for g in FAMILY.tensor_groups(cfg)}
    assert set(stored) == set(expected)
    for name, g in expected.items():
        assert tuple(stored[name]["weight"]["shape"]) == g.shape, name
    assert not [n for n in stored if "shared_expert" in n]                       # no shared expert
    assert {FAMILY.role_of(n) for n in stored if ".self_attn." in n} == {
        "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "norms"}     # q_norm / k_norm are norms
    assert sum(FAMILY.role_of(n) == "routed_experts" for n in stored) == spec.num_hidden_layers * 8 * 3


@pytest.mark.slow
def test_export_quantizes_routed_experts_only(built):
    spec, _, nvfp4 = built
    stored = _groups(nvfp4)
    from nvfp4stack.plan.groups import sniff_scheme

    schemes = {n: sniff_scheme(s) for n, s in stored.items()}
    experts = {s for n, s in schemes.items() if FAMILY.role_of(n) == "routed_experts"}
    others = {s for n, s in schemes.items() if FAMILY.role_of(n) != "routed_experts"}
    assert experts == {Scheme.NVFP4} and Scheme.NVFP4 not in others
    qcfg = json.loads((nvfp4 / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == "modelopt" and qcfg["quant_algo"] == "NVFP4"


@pytest.mark.slow
def test_doctor_accepts_both_builds_and_names_a_missing_scale(built, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from nvfp4stack.doctor.files import read_checkpoint
    from nvfp4stack.doctor.report import DoctorReport

    _, bf16, nvfp4 = built
    for ckpt in (bf16, nvfp4):
        report = DoctorReport(str(ckpt))
        ok = FAMILY.check_checkpoint(json.loads((ckpt / "config.json").read_text()), read_checkpoint(ckpt, report), report)
        assert ok and not report.errors, [f.line() for f in report.findings]

    broken = tmp_path / "broken"
    shutil.copytree(nvfp4, broken)
    (f,) = sorted(broken.glob("*.safetensors"))
    tensors = load_file(f)
    gone = "model.layers.1.mlp.experts.5.down_proj.weight_scale"
    del tensors[gone]
    save_file(tensors, f, metadata={"format": "pt"})
    report = DoctorReport(str(broken))
    ok = FAMILY.check_checkpoint(json.loads((broken / "config.json").read_text()), read_checkpoint(broken, report), report)
    assert not ok and [e.where for e in report.errors] == [gone]


@pytest.mark.slow
def test_reference_forward_carries_the_exported_experts(built):
    """The reference carries the export's dequantized experts (NVFP4's ~10% weight error), so its logits
    are near the BF16 model's without being equal; W4A4 differs from W4A16. The random model's logits
    are flat, so a small error already moves top-1 on some positions: over 17 seeds top-1 agreement (69
    positions) was 0.62-0.80 for W4A16 and 0.52-0.72 for W4A4, one CI seed 0.49 for W4A4; the bounds sit
    ~5 standard deviations below the means, far above chance (1/512)."""
    from transformers import Qwen3MoeForCausalLM

    from nvfp4stack.eval.e2e import compare_models
    from nvfp4stack.models.qwen3_moe.reference import reference_model

    _, bf16, nvfp4 = built
    ref = Qwen3MoeForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    w4a16 = reference_model(bf16, nvfp4, w4a4=False)
    w4a4 = reference_model(bf16, nvfp4, w4a4=True)
    ids = [torch.randint(3, 512, (1, 24), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with torch.no_grad():
        m16, m4 = compare_models(ref, w4a16, ids), compare_models(ref, w4a4, ids)
        same = compare_models(ref, ref, ids)
    print(m16, m4)
    assert same["kl_mean"] == pytest.approx(0.0, abs=1e-9) and same["top1_agreement"] == 1.0
    for m, top1 in ((m16, 0.5), (m4, 0.3)):
        assert 0 < m["kl_mean"] < 0.5 and m["top1_agreement"] >= top1 and math.isfinite(m["ppl_quant"])
    assert m4["kl_mean"] != m16["kl_mean"]
    for layer_ref, layer_q in zip(ref.model.layers, w4a16.model.layers):
        w, q = layer_ref.mlp.experts.gate_up_proj, layer_q.mlp.experts.gate_up_proj
        rel = ((w - q).norm() / w.norm()).item()
        assert 0.03 < rel < 0.2, rel


@pytest.mark.slow
def test_reference_of_a_weight_only_export(built, tmp_path):
    """A data-free export (no input_scale, as convert writes) serves W4A16: its reference loads; the W4A4
    reference needs the calibrated scales and says which tensor is missing and how to get it."""
    import shutil

    from safetensors.torch import load_file, save_file

    from nvfp4stack.models.qwen3_moe.reference import reference_model

    _, bf16, nvfp4 = built
    weight_only = tmp_path / "weight_only"
    shutil.copytree(nvfp4, weight_only)
    for f in weight_only.glob("*.safetensors"):
        tensors = load_file(f)
        save_file({k: v for k, v in tensors.items() if not k.endswith("input_scale")}, f, metadata={"format": "pt"})
    with_scales = reference_model(bf16, nvfp4, w4a4=False)
    without = reference_model(bf16, weight_only, w4a4=False)
    for a, b in zip(with_scales.model.layers, without.model.layers):
        assert torch.equal(a.mlp.experts.gate_up_proj, b.mlp.experts.gate_up_proj)
    with pytest.raises(KeyError, match=r"model\.layers\.0\.mlp\.experts\.0\.gate_proj\.input_scale missing.*"
                                       r"calibrate with quantize"):
        reference_model(bf16, weight_only, w4a4=True)


def test_ensure_builds_once_then_reuses(tmp_path):
    spec = TinyQwen3MoeSpec(num_hidden_layers=1, vocab_size=300, num_experts=2, num_experts_per_tok=1)
    first = ensure_tiny_qwen3_moe(tmp_path, spec)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = ensure_tiny_qwen3_moe(tmp_path, spec)
    assert again == first == tmp_path / "random" and (again / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((first / "nvfp4stack_spec.json").read_text())["num_experts"] == 2


def test_serve_checkpoint_is_none_for_models_it_does_not_build(tmp_path):
    cfg = SimpleNamespace(model=SimpleNamespace(factory=None, path=str(tmp_path)), cache_dir=str(tmp_path))
    assert FAMILY.serve_checkpoint(cfg, plan=None, build=False) is None
