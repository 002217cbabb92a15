"""ModelFamily's generic defaults and what the registered families declare instead."""
import pytest

from nvfp4stack.families import registry
from nvfp4stack.families.family import ModelFamily
from nvfp4stack.families.registry import get_family
from tests.support.toy_family import register_toy_family


def test_gate_up_pairs_default_and_declared():
    assert ModelFamily.gate_up_pairs == (("gate_proj", "up_proj"),)
    assert get_family("qwen3_moe").gate_up_pairs == (("gate_proj", "up_proj"),)
    assert get_family("deepseek_v3").gate_up_pairs == (("gate_proj", "up_proj"),)  # transformers' names
    assert get_family("deepseek_v4").gate_up_pairs == (("w1", "w3"),)               # native / unified names


def test_registry_gate_up_pairs_is_every_familys_once(monkeypatch):
    assert set(registry.gate_up_pairs()) == {("w1", "w3"), ("gate_proj", "up_proj")}
    assert len(registry.gate_up_pairs()) == 2
    register_toy_family(monkeypatch, gate_up_pairs=(("wg", "wu"), ("w1", "w3")))
    assert registry.gate_up_pairs()[-1] == ("wg", "wu") and len(registry.gate_up_pairs()) == 3


def test_mtp_is_the_native_module_or_a_layer_past_the_last():
    generic = ModelFamily()
    assert not generic.is_mtp("mtp.0.ffn.experts.1.w1.weight")                 # no native MTP module
    assert generic.is_mtp("model.layers.61.mlp.experts.0.gate_proj", num_hidden_layers=61)
    assert not generic.is_mtp("model.layers.60.mlp.experts.0.gate_proj", num_hidden_layers=61)
    assert not generic.is_mtp("model.layers.61.mlp.experts.0.gate_proj")       # layer count unknown
    v4 = get_family("deepseek_v4")
    assert v4.mtp_module == "mtp" and v4.is_mtp("mtp.0.ffn.experts.1.w1.weight") and v4.is_mtp("model.mtp.1.e_proj.weight")
    assert not v4.is_mtp("layers.0.mtp_gate.weight") and not v4.is_mtp("mtp.e_proj.weight")   # mtp.<N>. only
    assert v4.is_mtp("layers.4.ffn.experts.0.w1", num_hidden_layers=4)
    assert get_family("qwen3_moe").mtp_module == "" and get_family("deepseek_v3").mtp_module == ""


def test_a_familys_own_mtp_module(monkeypatch):
    toy = register_toy_family(monkeypatch, mtp_module="nextn")
    assert toy.is_mtp("nextn.0.attn.q.weight") and not toy.is_mtp("mtp.0.attn.q.weight")


def test_mtp_layers_hook():
    hf = {"num_nextn_predict_layers": 2}
    assert ModelFamily().mtp_layers(hf) == 0 and get_family("qwen3_moe").mtp_layers(hf) == 0
    assert get_family("deepseek_v3").mtp_layers(hf) == 2 and get_family("deepseek_v4").mtp_layers(hf) == 2
    assert get_family("deepseek_v4").mtp_layers({}) == 0


def test_generic_patterns_are_transformers_moe_names_only():
    generic = ModelFamily()
    for name, role in [("model.layers.0.mlp.experts.3.gate_proj.weight", "routed_experts"),
                       ("model.layers.0.mlp.shared_experts.down_proj", "shared_experts"),
                       ("model.layers.0.mlp.shared_expert.up_proj", "shared_experts"),
                       ("model.layers.0.mlp.gate_up_proj", "dense_mlp"),
                       ("model.layers.0.mlp.gate.weight", "gate"), ("model.layers.0.mlp.gate.bias", "gate.bias"),
                       ("model.embed_tokens.weight", "embed"), ("lm_head.weight", "head"),
                       ("model.layers.0.input_layernorm.weight", "norms")]:
        assert generic.role_of(name) == role, name
    # DeepSeek spellings belong to the DeepSeek families' own role_patterns
    for name in ("layers.0.ffn.experts.3.w1.weight", "layers.0.ffn.shared_experts.w2", "layers.0.ffn.gate.weight",
                 "model.layers.0.mlp.w1", "model.layers.1.mlp.gate.e_score_correction_bias",
                 "mtp.0.e_proj.weight", "mtp.0.h_proj", "model.layers.61.eh_proj.weight", "embed.weight", "head.weight"):
        assert generic.role_of(name) is None, name
        assert get_family("qwen3_moe").role_of(name) is None, name


def test_deepseek_families_map_their_own_spellings():
    v4, v3 = get_family("deepseek_v4"), get_family("deepseek_v3")
    for name, role in [("layers.0.ffn.experts.3.w1.weight", "routed_experts"), ("mtp.0.ffn.experts.3.w2", "routed_experts"),
                       ("layers.0.ffn.shared_experts.w2.scale", "shared_experts"), ("layers.0.ffn.gate.weight", "gate"),
                       ("layers.3.ffn.gate.bias", "gate.bias"), ("layers.0.ffn.gate.tid2eid", "gate.bias"),
                       ("model.layers.1.mlp.gate.e_score_correction_bias", "gate.bias"),  # transformers' names
                       ("model.layers.1.ffn.experts.0.w3.weight", "routed_experts"),       # unified (save_pretrained)
                       ("mtp.0.e_proj.weight", "mtp.proj"), ("mtp.0.h_proj", "mtp.proj"),
                       ("embed.weight", "embed"), ("head.weight", "head"), ("model.embed_tokens.weight", "embed")]:
        assert v4.role_of(name) == role, name
    for name, role in [("model.layers.1.mlp.gate.e_score_correction_bias", "gate.bias"),
                       ("model.layers.61.eh_proj.weight", "mtp.proj"), ("model.layers.61.eh_proj", "mtp.proj"),
                       ("model.layers.61.shared_head.head.weight", "head"), ("model.layers.61.shared_head.norm", "norms"),
                       ("model.layers.1.mlp.experts.0.gate_proj", "routed_experts"), ("lm_head.weight", "head")]:
        assert v3.role_of(name) == role, name
    assert v4.role_of("model.layers.61.eh_proj") is None and v3.role_of("mtp.0.e_proj") is None
    assert "mtp.proj" in ModelFamily().roles   # a generic role: families map their own MTP names to it


def test_generic_source_scheme():
    from nvfp4stack.families.contract import FamilyCapabilityError, TensorGroup
    from nvfp4stack.schemes import Scheme

    experts, attn = TensorGroup("e", (2, 2), "routed_experts"), TensorGroup("a", (2, 2), "attn.q_proj")
    norm = TensorGroup("n", (2,), "norms", is_matrix=False)
    for fam in (ModelFamily(), get_family("qwen3_moe"), get_family("deepseek_v3")):
        assert fam.source_scheme(experts, "modelopt") is Scheme.NVFP4 and fam.source_scheme(attn, "modelopt") is Scheme.BF16
        assert fam.source_scheme(experts, "bf16") is Scheme.BF16 and fam.source_scheme(norm, "modelopt") is Scheme.PASSTHROUGH
    with pytest.raises(FamilyCapabilityError, match="model.source_format='official'"):
        get_family("qwen3_moe").source_scheme(experts, "official")
    v4 = get_family("deepseek_v4")
    assert v4.source_scheme(experts, "official") is Scheme.MXFP4 and v4.source_scheme(attn, "official") is Scheme.FP8_BLOCK
