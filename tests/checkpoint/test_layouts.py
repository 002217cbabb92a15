"""Name layouts: every mapping direction on the full tiny DSV4 key set, checked against transformers."""
from __future__ import annotations

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.models.deepseek_v4 import layouts as L
from nvfp4stack.models.deepseek_v4.tiny import layout_dir


@pytest.fixture(scope="module")
def native(root):
    r = ShardedReader(layout_dir(root, "bf16"))
    return {n: r.get(n) for n in r.names()}


@pytest.fixture(scope="module")
def hf_model(root):
    from transformers import DeepseekV4ForCausalLM

    model, info = DeepseekV4ForCausalLM.from_pretrained(layout_dir(root, "bf16"), dtype=torch.float32,
                                                        output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model


def test_native_to_hf_state_equals_transformers_own_loading(native, hf_model):
    ours = L.native_state_to_hf(native)
    theirs = hf_model.state_dict()
    assert set(ours) == set(theirs)
    bad = [k for k in ours if not torch.equal(ours[k].float(), theirs[k].float())]
    assert not bad, bad[:5]


def test_native_hf_native_round_trip_is_identity_without_mtp(native):
    back = L.hf_state_to_native(L.native_state_to_hf(native))
    no_mtp = {k: v for k, v in native.items() if not k.startswith("mtp.")}
    assert set(back) == set(no_mtp)
    assert all(torch.equal(back[k], no_mtp[k]) for k in no_mtp)
    assert all(L.native_to_hf(k) is None for k in native if k.startswith("mtp."))


def test_hf_names_map_back_one_to_one(hf_model):
    names = [n for n in hf_model.state_dict() if not n.endswith(("gate_up_proj", "down_proj"))
             or "shared_experts" in n]
    natives = [L.hf_to_native(n) for n in names]
    assert len(set(natives)) == len(names)
    assert [L.native_to_hf(n) for n in natives] == names


def test_unified_names_equal_what_transformers_save_pretrained_writes(root, native):
    saved = set(ShardedReader(layout_dir(root, "hf")).infos)
    mapped = {L.native_to_unified(n) for n in native if not n.startswith("mtp.")}
    assert mapped == saved
    assert {L.unified_to_native(n) for n in saved} == {n for n in native if not n.startswith("mtp.")}
    assert L.native_to_unified("layers.2.attn.kv_norm.weight") == "model.layers.2.attn.norm.weight"
    assert L.unified_to_native("model.layers.2.attn.compressor.norm.weight") == "layers.2.attn.compressor.norm.weight"


def test_known_pitfall_pairs():
    # the seed team's failures: ffn vs mlp, w1 vs gate_proj, attn vs self_attn, kv_norm, position_bias
    assert L.native_to_hf("layers.0.ffn.shared_experts.w1.weight") == "model.layers.0.mlp.shared_experts.gate_proj.weight"
    assert L.native_to_hf("layers.3.attn.kv_norm.weight") == "model.layers.3.self_attn.kv_norm.weight"
    assert L.native_to_hf("layers.3.attn.compressor.norm.weight") == "model.layers.3.self_attn.compressor.kv_norm.weight"
    assert L.native_to_hf("layers.1.attn.indexer.compressor.ape") == "model.layers.1.self_attn.compressor.indexer.position_bias"
    assert L.map_name("layers.1.ffn.experts.2.w3.weight_scale_2", L.native_to_unified) == \
        "model.layers.1.ffn.experts.2.w3.weight_scale_2"


def test_unknown_names_raise_with_the_name():
    with pytest.raises(L.LayoutError, match="layers.0.attn.position_bias"):
        L.native_to_hf("layers.0.attn.position_bias")
    with pytest.raises(L.LayoutError, match="model.layers.0.mlp.foo"):
        L.hf_to_native("model.layers.0.mlp.foo")
    with pytest.raises(L.LayoutError, match="incomplete"):
        L.native_state_to_hf({"layers.0.ffn.experts.0.w1.weight": torch.zeros(2, 2)})
