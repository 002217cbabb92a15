"""ModelFamily's generic defaults and what the registered families declare instead."""
from nvfp4stack.models import registry
from nvfp4stack.models.family import ModelFamily
from nvfp4stack.models.registry import get_family
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
