"""Qwen3-MoE planning from config.json alone: the 235B-A22B descriptor, roles, stored schemes, KV cache."""
import json
from pathlib import Path

import pytest

from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.models.qwen3_moe import FAMILY
from nvfp4stack.schemes import Scheme

HF = json.loads((Path(__file__).resolve().parents[3] / "nvfp4stack/models/qwen3_moe/descriptors/qwen3_235b_a22b.json").read_text())


def test_descriptor_is_qwen3_235b_a22b():
    groups = FAMILY.tensor_groups(HF)
    total = sum(g.numel for g in groups)
    experts = sum(g.numel for g in groups if g.role == "routed_experts")
    active = total - experts + experts * HF["num_experts_per_tok"] // HF["num_experts"]
    assert round(total / 1e9) == 235 and round(active / 1e9) == 22          # the name: 235B total, A22B active
    assert sum(g.role == "routed_experts" for g in groups) == 94 * 128 * 3
    assert {g.role for g in groups} == {"embed", "head", "norms", "gate", "routed_experts",
                                         "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"}
    by_name = {g.name: g for g in groups}
    assert by_name["model.layers.93.self_attn.q_proj"].shape == (64 * 128, 4096)
    assert by_name["model.layers.93.self_attn.k_proj"].shape == (4 * 128, 4096)
    assert by_name["model.layers.0.mlp.experts.127.down_proj"].shape == (4096, 1536)
    assert by_name["model.layers.0.mlp.gate"].shape == (128, 4096)


def test_dense_layers_follow_mlp_only_layers():
    hf = {**HF, "num_hidden_layers": 3, "mlp_only_layers": [1]}
    roles = {g.name.rsplit(".", 1)[0]: g.role for g in FAMILY.tensor_groups(hf) if g.is_matrix}
    assert roles["model.layers.1.mlp"] == "dense_mlp" and "model.layers.1.mlp.experts.0" not in roles
    assert roles["model.layers.2.mlp.experts.0"] == "routed_experts"


@pytest.mark.parametrize("name,role", [
    ("model.layers.3.self_attn.q_proj.weight", "attn.q_proj"),
    ("model.layers.3.self_attn.o_proj", "attn.o_proj"),
    ("model.layers.3.self_attn.k_norm.weight", "norms"),
    ("model.layers.3.mlp.experts.7.up_proj.weight_scale", "routed_experts"),
    ("model.layers.3.mlp.experts", "routed_experts"),          # vLLM's FusedMoE prefix
    ("model.layers.3.mlp.gate.weight", "gate"),
    ("model.embed_tokens.weight", "embed"),
    ("lm_head.weight", "head"),
])
def test_role_of_every_layout(name, role):
    assert FAMILY.role_of(name) == role


def test_source_scheme():
    expert = TensorGroup("model.layers.0.mlp.experts.0.gate_proj", (1536, 4096), "routed_experts")
    attn = TensorGroup("model.layers.0.self_attn.q_proj", (8192, 4096), "attn.q_proj")
    norm = TensorGroup("model.norm", (4096,), "norms", is_matrix=False)
    assert FAMILY.source_scheme(expert, "bf16") is Scheme.BF16
    assert FAMILY.source_scheme(expert, "modelopt") is Scheme.NVFP4
    assert FAMILY.source_scheme(attn, "modelopt") is Scheme.BF16
    assert FAMILY.source_scheme(norm, "bf16") is Scheme.PASSTHROUGH


@pytest.mark.parametrize("kv_dtype,tp,block,per_token", [
    ("fp8", 8, None, 94 * 2 * 1 * 128 * 1),      # 4 KV heads over 8 ranks: each caches one (replicated)
    ("fp8", 4, 16, 94 * 2 * 1 * 128 * 1),
    ("auto", 1, None, 94 * 2 * 4 * 128 * 2),     # the model dtype, bf16
    ("bfloat16", 2, 32, 94 * 2 * 2 * 128 * 2),
])
def test_kv_cache_per_gpu(kv_dtype, tp, block, per_token):
    stored, (line,) = FAMILY.kv_cache(HF, kv_dtype, block, 0, tp=tp)
    assert stored == ("bfloat16" if kv_dtype == "auto" else kv_dtype)
    assert line.bytes_per_token == per_token and line.layers == 94
    assert line.page_bytes == (block or 16) * per_token // 94 and line.bytes_per_seq == 0


def test_kv_cache_rejects_an_unknown_dtype():
    with pytest.raises(ValueError, match="engine.kv_cache_dtype='fp8_ds_mla'"):
        FAMILY.kv_cache(HF, "fp8_ds_mla", None, 0)


def test_family_identity():
    assert FAMILY.name == "qwen3_moe" and "Qwen3MoeForCausalLM" in FAMILY.hf_architectures
    assert "tiny_qwen3_moe" in FAMILY.factories()
    assert set(FAMILY.precision_roles) >= {"routed_experts", "attn.q_proj", "attn.o_proj"}


def test_served_config_excludes_what_is_not_stored_nvfp4():
    """convert's config.json: modelopt NVFP4 with every module not stored NVFP4 under ``ignore``: the
    non-expert modules, the dense MLP of a non-MoE layer, and the experts of a layer the plan keeps BF16."""
    from types import SimpleNamespace

    src = {"num_hidden_layers": 4, "num_experts": 2, "mlp_only_layers": [3], "decoder_sparse_step": 1}

    def experts(layer, target, converter):
        return [SimpleNamespace(role="routed_experts", name=f"model.layers.{layer}.mlp.experts.{e}.{p}",
                                target=target, converter=converter) for e in range(2) for p in ("gate_proj", "down_proj")]

    attn = [SimpleNamespace(role="attn.q_proj", name="model.layers.0.self_attn.q_proj", target=Scheme.BF16, converter=None)]
    groups = attn + experts(0, Scheme.NVFP4, "bf16_to_nvfp4") + experts(1, Scheme.BF16, None) \
        + experts(2, Scheme.NVFP4_W4A16, "bf16_to_nvfp4")
    quant = FAMILY.served_config(src, groups)["quantization_config"]
    assert quant["quant_algo"] == "NVFP4" and quant["config_groups"]["group_0"]["weights"]["group_size"] == 16
    ignore = set(quant["ignore"])
    assert {"lm_head", "model.embed_tokens", "model.layers.1.mlp.experts*", "model.layers.3.mlp*"} <= ignore
    assert {f"model.layers.{i}.self_attn*" for i in range(4)} <= ignore
    assert {f"model.layers.{i}.mlp.gate" for i in range(3)} <= ignore
    assert not {"model.layers.0.mlp.experts*", "model.layers.2.mlp.experts*", "model.layers.3.mlp.gate"} & ignore
    # nothing converted to NVFP4: the source's config.json is copied as it is
    assert FAMILY.served_config(src, attn + experts(0, Scheme.BF16, None)) is None
