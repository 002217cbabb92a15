"""quantize/report.py's grouping: roles, with the MTP block apart by the family's own MTP test."""
import json

from nvfp4stack.families.registry import get_family
from nvfp4stack.quantize.report import _group_key, _num_hidden_layers


def test_mtp_tensors_group_apart_as_plan_roles_says():
    v4, qwen = get_family("deepseek_v4"), get_family("qwen3_moe")
    assert _group_key("mtp.0.ffn.experts.1.w1.weight", v4) == "mtp.routed_experts"
    assert _group_key("mtp.0.ffn.experts.1.w1.weight") == "mtp.routed_experts"       # any family's
    assert _group_key("mtp.0.e_proj.weight", v4) == "mtp.proj"                       # an MTP role already
    assert _group_key("layers.0.ffn.experts.1.w1.weight", v4, 4) == "routed_experts"
    # transformers / vLLM numbering: the MTP layer is the decoder layer past the last
    name = "model.layers.2.mlp.experts.0.gate_proj.weight"
    assert _group_key(name, qwen, 2) == "mtp.routed_experts"
    assert _group_key(name, qwen, 3) == "routed_experts"
    assert _group_key(name, qwen) == "routed_experts"


def test_num_hidden_layers_from_the_checkpoints_config(tmp_path):
    assert _num_hidden_layers(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 3}))
    assert _num_hidden_layers(tmp_path) == 3
