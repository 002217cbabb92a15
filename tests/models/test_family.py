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
