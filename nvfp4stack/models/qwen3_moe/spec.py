"""Qwen3-MoE tensor groups and KV cache from config.json alone (weight-free planning).

Names and shapes follow transformers' checkpoint layout of ``Qwen3MoeForCausalLM`` (what the
released checkpoints and modelopt's export store, and what vLLM's ``qwen3_moe.py`` loads):
``model.layers.L.self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``, ``mlp.gate``,
``mlp.experts.E.{gate,up,down}_proj``; ``[out_features, in_features]``.
"""
from __future__ import annotations

from typing import Iterator

from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.plan.kv_cache import DEFAULT_BLOCK


def num_experts(hf: dict) -> int:
    """Routed experts per MoE layer: ``num_experts`` in Qwen's config.json; transformers 5 saves
    ``num_local_experts``."""
    for key in ("num_experts", "num_local_experts"):
        if hf.get(key):
            return int(hf[key])
    raise KeyError("config.json: neither num_experts nor num_local_experts is set; expected the routed expert "
                   "count of a Qwen3-MoE config")


def is_moe_layer(hf: dict, layer: int) -> bool:
    """vLLM's rule (qwen3_moe.py): sparse unless listed in mlp_only_layers, every decoder_sparse_step-th."""
    step = int(hf.get("decoder_sparse_step", 1) or 1)
    return layer not in (hf.get("mlp_only_layers") or []) and num_experts(hf) > 0 and (layer + 1) % step == 0


def _head_dim(hf: dict) -> int:
    return int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])


def qwen3_moe_tensor_groups(hf: dict) -> Iterator[TensorGroup]:
    """Every tensor group of the model ``hf`` describes (no MTP block: Qwen3-MoE has none)."""
    H, V = int(hf["hidden_size"]), int(hf["vocab_size"])
    heads, kv, hd = int(hf["num_attention_heads"]), int(hf["num_key_value_heads"]), _head_dim(hf)
    E, inter, dense = num_experts(hf), int(hf["moe_intermediate_size"]), int(hf.get("intermediate_size", 0))
    yield TensorGroup("model.embed_tokens", (V, H), "embed")
    for i in range(int(hf["num_hidden_layers"])):
        p = f"model.layers.{i}"
        yield TensorGroup(f"{p}.self_attn.q_proj", (heads * hd, H), "attn.q_proj")
        yield TensorGroup(f"{p}.self_attn.k_proj", (kv * hd, H), "attn.k_proj")
        yield TensorGroup(f"{p}.self_attn.v_proj", (kv * hd, H), "attn.v_proj")
        yield TensorGroup(f"{p}.self_attn.o_proj", (H, heads * hd), "attn.o_proj")
        for norm in ("q_norm", "k_norm"):
            yield TensorGroup(f"{p}.self_attn.{norm}", (hd,), "norms", is_matrix=False)
        if is_moe_layer(hf, i):
            yield TensorGroup(f"{p}.mlp.gate", (E, H), "gate")
            for e in range(E):
                yield TensorGroup(f"{p}.mlp.experts.{e}.gate_proj", (inter, H), "routed_experts")
                yield TensorGroup(f"{p}.mlp.experts.{e}.up_proj", (inter, H), "routed_experts")
                yield TensorGroup(f"{p}.mlp.experts.{e}.down_proj", (H, inter), "routed_experts")
        else:
            yield TensorGroup(f"{p}.mlp.gate_proj", (dense, H), "dense_mlp")
            yield TensorGroup(f"{p}.mlp.up_proj", (dense, H), "dense_mlp")
            yield TensorGroup(f"{p}.mlp.down_proj", (H, dense), "dense_mlp")
        for norm in ("input_layernorm", "post_attention_layernorm"):
            yield TensorGroup(f"{p}.{norm}", (H,), "norms", is_matrix=False)
    yield TensorGroup("model.norm", (H,), "norms", is_matrix=False)
    yield TensorGroup("lm_head", (V, H), "head")


def kv_heads_per_gpu(hf: dict, tp: int) -> int:
    """K/V heads one tensor-parallel rank caches: vLLM splits them over TP ranks and replicates them
    once TP exceeds their count (``max(1, num_kv_heads // tp)``, QKVParallelLinear)."""
    return max(1, int(hf["num_key_value_heads"]) // max(1, tp))


def qwen3_moe_cache_lines(hf: dict, kv_dtype: str, block_size: int | None, tp: int = 1,
                          model_dtype: str | None = None):
    """``(stored dtype, [CacheLine])``: one paged K and V row per token per layer (full attention);
    ``model_dtype``: the dtype the engine runs the model in (None: ``--dtype auto``'s, from ``hf``)."""
    from nvfp4stack.plan.kv_cache import CacheLine, kv_bytes_per_element
    from nvfp4stack.plan.kv_cache import model_dtype as auto_dtype

    stored, elem = kv_bytes_per_element(kv_dtype, model_dtype or auto_dtype("auto", hf))
    layers = int(hf["num_hidden_layers"])
    per_layer = 2 * kv_heads_per_gpu(hf, tp) * _head_dim(hf) * elem          # K and V
    block = block_size or DEFAULT_BLOCK
    return stored, [CacheLine(f"kv (k+v, {kv_heads_per_gpu(hf, tp)} heads/GPU)", layers, block * per_layer, block,
                              bytes_per_token=float(layers * per_layer))]
