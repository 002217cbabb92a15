import pytest

from nvfp4stack.families.registry import get_family
from nvfp4stack.plan.roles import ROLES, is_mtp, role_covers, role_of


@pytest.mark.parametrize("name,role", [
    # DeepSeek-native
    ("layers.0.ffn.experts.3.w1.weight", "routed_experts"),
    ("layers.0.ffn.shared_experts.w2.weight", "shared_experts"),
    ("layers.0.ffn.gate.weight", "gate"),
    ("layers.0.ffn.gate.tid2eid", "gate.bias"),
    ("layers.3.ffn.gate.bias", "gate.bias"),
    ("model.layers.1.mlp.gate.e_score_correction_bias", "gate.bias"),
    ("model.layers.1.mlp.gate", "gate"),
    ("model.layers.0.mlp.down_proj", "dense_mlp"),
    ("model.layers.0.mlp.gate_proj.weight", "dense_mlp"),
    ("layers.2.attn.wq_a.weight", "attn.wq_a"),
    ("layers.2.attn.wq_b.scale", "attn.wq_b"),
    ("layers.2.attn.wkv.weight", "attn.wkv"),
    ("layers.2.attn.wo_a.weight", "attn.wo_a"),
    ("layers.2.attn.wo_b.weight", "attn.wo_b"),
    ("layers.2.attn.compressor.wkv.weight", "compressor"),
    ("layers.2.attn.indexer.compressor.wgate.weight", "compressor"),
    ("layers.2.attn.indexer.wq_b.weight", "indexer.wq_b"),
    ("layers.2.attn.indexer.weights_proj.weight", "indexer.weights_proj"),
    ("layers.2.attn.kv_norm.weight", "norms"),
    ("layers.2.attn.attn_sink", "attn_sink"),
    ("layers.2.hc_attn_fn", "mhc"),
    ("hc_head_base", "mhc"),
    ("embed.weight", "embed"),
    ("head.weight", "head"),
    ("mtp.0.e_proj.weight", "mtp.proj"),
    # transformers / vLLM
    ("model.layers.0.mlp.experts.gate_up_proj", "routed_experts"),
    ("model.layers.0.mlp.experts", "routed_experts"),
    ("model.layers.0.mlp.shared_experts.down_proj.weight", "shared_experts"),
    ("model.layers.0.self_attn.q_a_proj.weight", "attn.wq_a"),
    ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "attn.wkv"),
    ("model.layers.0.self_attn.kv_b_proj.weight", "attn.wkv_b"),
    ("model.layers.0.self_attn.o_proj.weight", "attn.wo_b"),
    ("model.layers.0.attn.fused_wqa_wkv", "attn.wq_a"),
    ("model.embed_tokens.weight", "embed"),
    ("lm_head.weight", "head"),
    ("model.layers.0.input_layernorm.weight", "norms"),
])
def test_role_of_every_layout(name, role):
    assert role in ROLES
    assert role_of(name) == role


def test_unknown_name_has_no_role():
    assert role_of("layers.0.position_bias") is None


def test_mtp_detection():
    assert is_mtp("mtp.0.ffn.experts.1.w1.weight")
    assert is_mtp("model.layers.61.mlp.experts", num_hidden_layers=61)
    assert not is_mtp("model.layers.60.mlp.experts", num_hidden_layers=61)


def test_mtp_detection_by_the_named_family():
    assert is_mtp("mtp.0.ffn.experts.1.w1.weight", 4, family=get_family("deepseek_v4"))
    assert not is_mtp("mtp.0.ffn.experts.1.w1.weight", 4, family=get_family("qwen3_moe"))   # no native MTP module
    assert is_mtp("model.layers.4.mlp.experts", 4, family=get_family("qwen3_moe"))


def test_role_tree():
    assert role_covers("attn", "attn.wo_a") and role_covers("attn.wo_a", "attn.wo_a")
    assert not role_covers("attn", "attn_sink") and not role_covers("indexer", "indexer_x")


def test_every_tensor_of_the_tiny_models_has_a_named_role(tmp_path):
    """Issue #18: no plan row under 'unknown', and one row per (role, decision)."""
    from nvfp4stack.cli import compose_config
    from nvfp4stack.plan.build import plan_for_config

    for recipe in ("tiny_cpu", "tiny_dsv4"):
        plan = plan_for_config(compose_config(f"recipe={recipe}", f"run_dir={tmp_path}"))
        assert all(g.role in ROLES for g in plan.groups), sorted({g.role for g in plan.groups} - set(ROLES))
        gate_rows = [r for r in plan.rows if r.role == "gate" and not r.mtp]
        assert len(gate_rows) == 1 and gate_rows[0].kernel == "unquantized"  # the bias is gate.bias
    assert {"dense_mlp", "gate.bias"} <= {g.role for g in plan_for_config(
        compose_config("recipe=tiny_cpu", f"run_dir={tmp_path}")).groups}
