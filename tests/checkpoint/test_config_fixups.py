"""config.json fix-ups: one test per fix-up, plus the serving chain on transformers' saved config."""
from __future__ import annotations

import copy

import pytest

from nvfp4stack.models.deepseek_v4 import config_fixups as F

SAVED = {  # the shape of what transformers 5.19 save_pretrained writes for DeepSeek-V4
    "model_type": "deepseek_v4", "num_hidden_layers": 4, "head_dim": 512, "partial_rotary_factor": 0.125,
    "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                    "compressed_sparse_attention"],
    "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
    "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
                        "compress": {"rope_type": "yarn", "factor": 16, "rope_theta": 160000.0,
                                     "partial_rotary_factor": 0.125}},
}


def test_fixups_do_not_mutate_input():
    before = copy.deepcopy(SAVED)
    F.apply_fixups(SAVED)
    assert SAVED == before


def test_legacy_compress_ratios():
    assert F.legacy_compress_ratios(SAVED)["compress_ratios"] == [0, 4, 128, 4]
    with pytest.raises(KeyError, match="layer_types"):
        F.legacy_compress_ratios({"num_hidden_layers": 2})


def test_legacy_num_hash_layers():
    assert F.legacy_num_hash_layers(SAVED)["num_hash_layers"] == 1
    with pytest.raises(ValueError, match="hash_moe layers must come first"):
        F.legacy_num_hash_layers({"mlp_layer_types": ["moe", "hash_moe"]})


def test_transformers_layer_types_from_legacy():
    out = F.transformers_layer_types({"num_hidden_layers": 3, "compress_ratios": [0, 128, 4], "num_hash_layers": 2})
    assert out["layer_types"] == ["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention"]
    assert "mlp_layer_types" not in out
    with pytest.raises(ValueError, match="compress_ratios"):
        F.transformers_layer_types({"num_hidden_layers": 1, "compress_ratios": [8]})


def test_drop_mlp_layer_types_keeps_the_hash_layer_count():
    out = F.drop_mlp_layer_types(SAVED)
    assert "mlp_layer_types" not in out and out["num_hash_layers"] == 1


def test_topk_method():
    assert F.topk_method_noaux_tc(SAVED)["topk_method"] == "noaux_tc"
    with pytest.raises(ValueError, match="noaux_tc"):
        F.topk_method_noaux_tc({"topk_method": "greedy"})


def test_qk_rope_head_dim():
    assert F.qk_rope_head_dim(SAVED)["qk_rope_head_dim"] == 64


def test_flatten_rope():
    out = F.flatten_rope(SAVED)
    assert "rope_parameters" not in out
    assert (out["rope_theta"], out["compress_rope_theta"]) == (10000.0, 160000.0)
    assert out["rope_scaling"] == {"rope_type": "yarn", "factor": 16}


def test_moe_nvfp4_matches_modelopt_dsv4_rewrite():
    out = F.moe_nvfp4({"quantization_config": {"quant_method": "fp8", "scale_fmt": "ue8m0"}, "expert_dtype": "fp4"})
    q = out["quantization_config"]
    assert (q["quant_method"], q["moe_quant_algo"], q["activation_scheme"], q["weight_block_size"]) == \
        ("fp8", "NVFP4", "dynamic", [128, 128])
    assert q["scale_fmt"] == "ue8m0" and out["expert_dtype"] == "fp4"


def test_serve_chain_restores_what_vllm_reads_and_transformers_still_loads():
    from transformers import DeepseekV4Config

    out = F.apply_fixups(SAVED)
    for key in ("compress_ratios", "num_hash_layers", "topk_method", "qk_rope_head_dim"):
        assert key in out
    assert "mlp_layer_types" not in out  # vLLM's config validator rejects transformers' values
    cfg = DeepseekV4Config(**{k: v for k, v in out.items() if k != "model_type"})
    assert cfg.layer_types == SAVED["layer_types"] and cfg.qk_rope_head_dim == 64
    assert cfg.mlp_layer_types == SAVED["mlp_layer_types"]  # derived back from num_hash_layers
    assert F.CONFIG_FIXUPS.names() == sorted(F.CONFIG_FIXUPS.names()) and "moe_nvfp4" in F.CONFIG_FIXUPS


def test_fp8_block_ue8m0_declares_the_release_fp8_format():
    from nvfp4stack.models.deepseek_v4.config_fixups import fp8_block_ue8m0

    out = fp8_block_ue8m0({"quantization_config": {"moe_quant_algo": "NVFP4"}, "hidden_size": 8})
    q = out["quantization_config"]
    assert (q["quant_method"], q["fmt"], q["scale_fmt"], q["weight_block_size"]) == ("fp8", "e4m3", "ue8m0", [128, 128])
    assert q["moe_quant_algo"] == "NVFP4" and out["hidden_size"] == 8


def test_bf16_linears_are_ignored_by_the_fp8_config():
    """A BF16-kept attention / shared expert under quant_method fp8: vLLM would build FP8 parameters
    for it (the 61 'bfloat16 -> float8_e4m3fn' load errors of a convert from BF16) unless ignored."""
    from nvfp4stack.schemes import Scheme

    cfg = {**SAVED, "compress_ratios": [0, 4, 128, 4], "num_hash_layers": 1, "topk_method": "noaux_tc",
           "qk_rope_head_dim": 64}
    mods = ["layers.1.attn.wq_a", "layers.1.attn.wkv", "layers.0.ffn.shared_experts.w2", "layers.1.attn.wq_a"]
    out = F.served_config(cfg, {("routed_experts", Scheme.NVFP4), ("attn.wo_a", Scheme.FP8_BLOCK)}, mods)
    q = out["quantization_config"]
    assert q["quant_method"] == "fp8" and q["moe_quant_algo"] == "NVFP4"
    assert q["ignored_layers"] == ["layers.0.ffn.shared_experts.w2", "layers.1.attn.wkv", "layers.1.attn.wq_a"]
    # nothing kept BF16, or no FP8 config at all: no ignored_layers key
    assert "ignored_layers" not in F.served_config(cfg, {("attn.wo_a", Scheme.FP8_BLOCK)})["quantization_config"]
    assert "quantization_config" not in F.served_config(cfg, set(), mods)
