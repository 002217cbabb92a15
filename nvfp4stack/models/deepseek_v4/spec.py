"""DeepSeek-V4 tensor groups (native names and logical shapes) derived from config.json alone.

A *group* is one logical weight, e.g. ``layers.3.ffn.experts.17.w1``: its stored tensors
(``.weight`` plus ``.scale`` / ``.weight_scale`` ...) depend on the format and are not listed
here. Shapes follow vLLM's DeepSeek-V4 parameter creation (vllm/models/deepseek_v4:
attention.py, compressor.py, nvidia/model.py, nvidia/mtp.py), ``[out_features, in_features]``.
"""
from __future__ import annotations

from typing import Iterator

from nvfp4stack.families.contract import TensorGroup
from nvfp4stack.schemes import Scheme


def _compressor(prefix: str, hidden: int, head_dim: int, ratio: int, mtp: bool) -> Iterator[TensorGroup]:
    coff = 2 if ratio == 4 else 1  # ratio-4 compressors use overlapping windows (compressor.py)
    yield TensorGroup(f"{prefix}.wkv", (coff * head_dim, hidden), "compressor", mtp)
    yield TensorGroup(f"{prefix}.wgate", (coff * head_dim, hidden), "compressor", mtp)
    yield TensorGroup(f"{prefix}.ape", (ratio, coff * head_dim), "compressor", mtp, "f32", False)
    yield TensorGroup(f"{prefix}.norm", (head_dim,), "norms", mtp, "bf16", False)


def _block(c: dict, p: str, layer: int, ratio: int, hash_routed: bool, mtp: bool) -> Iterator[TensorGroup]:
    """One decoder block (attention + MoE + mHC) under prefix ``p``."""
    H, heads, hd = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    ql, og, ol = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    E, inter = c["n_routed_experts"], c["moe_intermediate_size"]
    hc = c.get("hc_mult", 4)
    T = lambda *a, **k: TensorGroup(*a, mtp=mtp, **k)  # noqa: E731
    # attention
    yield T(f"{p}.attn.wq_a", (ql, H), "attn.wq_a")
    yield T(f"{p}.attn.wq_b", (heads * hd, ql), "attn.wq_b")
    yield T(f"{p}.attn.wkv", (hd, H), "attn.wkv")
    yield T(f"{p}.attn.wo_a", (og * ol, heads * hd // og), "attn.wo_a")
    yield T(f"{p}.attn.wo_b", (H, og * ol), "attn.wo_b")
    yield T(f"{p}.attn.q_norm", (ql,), "norms", dtype="bf16", is_matrix=False)
    yield T(f"{p}.attn.kv_norm", (hd,), "norms", dtype="bf16", is_matrix=False)
    yield T(f"{p}.attn.attn_sink", (heads,), "attn_sink", dtype="f32", is_matrix=False)
    if ratio > 1:
        yield from _compressor(f"{p}.attn.compressor", H, hd, ratio, mtp)
    if ratio == 4:  # only the compressed-sparse (C4A) layers have a lightning indexer
        ih, ihd = c["index_n_heads"], c["index_head_dim"]
        yield T(f"{p}.attn.indexer.wq_b", (ih * ihd, ql), "indexer.wq_b")
        yield T(f"{p}.attn.indexer.weights_proj", (ih, H), "indexer.weights_proj")
        yield from _compressor(f"{p}.attn.indexer.compressor", H, ihd, ratio, mtp)
    # MoE
    yield T(f"{p}.ffn.gate", (E, H), "gate")
    if hash_routed:
        yield T(f"{p}.ffn.gate.tid2eid", (c["vocab_size"], c["num_experts_per_tok"]), "gate.bias", dtype="i64", is_matrix=False)
    else:
        yield T(f"{p}.ffn.gate.bias", (E,), "gate.bias", dtype="f32", is_matrix=False)
    for e in range(E):
        yield T(f"{p}.ffn.experts.{e}.w1", (inter, H), "routed_experts")
        yield T(f"{p}.ffn.experts.{e}.w2", (H, inter), "routed_experts")
        yield T(f"{p}.ffn.experts.{e}.w3", (inter, H), "routed_experts")
    si = inter * c.get("n_shared_experts", 1)
    yield T(f"{p}.ffn.shared_experts.w1", (si, H), "shared_experts")
    yield T(f"{p}.ffn.shared_experts.w2", (H, si), "shared_experts")
    yield T(f"{p}.ffn.shared_experts.w3", (si, H), "shared_experts")
    # norms and manifold-constrained hyper-connections
    yield T(f"{p}.attn_norm", (H,), "norms", dtype="bf16", is_matrix=False)
    yield T(f"{p}.ffn_norm", (H,), "norms", dtype="bf16", is_matrix=False)
    mix = (2 + hc) * hc
    for part in ("attn", "ffn"):
        yield T(f"{p}.hc_{part}_fn", (mix, hc * H), "mhc", dtype="f32", is_matrix=False)
        yield T(f"{p}.hc_{part}_base", (mix,), "mhc", dtype="f32", is_matrix=False)
        yield T(f"{p}.hc_{part}_scale", (3,), "mhc", dtype="f32", is_matrix=False)


DEFAULT_COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def ratios_from_layer_types(layer_types: list[str], rates: dict | None) -> list[int]:
    """transformers' per-layer attention types -> vLLM's compress_ratios (0 = window only)."""
    rates = rates or DEFAULT_COMPRESS_RATES
    return [0 if t == "sliding_attention" else int(rates[t]) for t in layer_types]


def compress_ratios(c: dict) -> list[int]:
    """Per-layer compress ratios, from the legacy list or from transformers' layer_types."""
    n = c["num_hidden_layers"]
    if "compress_ratios" in c:
        ratios = list(c["compress_ratios"])[:n]
    elif "layer_types" in c:
        ratios = ratios_from_layer_types(c["layer_types"], c.get("compress_rates"))
    else:
        raise KeyError(
            "config.json has neither 'compress_ratios' nor 'layer_types'; DeepSeek-V4 needs one "
            "of them (vLLM reads compress_ratios): add compress_ratios, one int per layer (0, 4 or 128)"
        )
    if len(ratios) != n:
        raise ValueError(
            f"config.json compress_ratios has {len(ratios)} entries, expected num_hidden_layers={n}"
        )
    return ratios


def hash_layers(c: dict) -> int:
    if "mlp_layer_types" in c:
        return sum(1 for t in c["mlp_layer_types"] if t == "hash_moe")
    return int(c.get("num_hash_layers", 3))


def dsv4_tensor_groups(c: dict) -> Iterator[TensorGroup]:
    """Every tensor group of a DeepSeek-V4 checkpoint in native names, MTP included."""
    H, V, hc = c["hidden_size"], c["vocab_size"], c.get("hc_mult", 4)
    yield TensorGroup("embed", (V, H), "embed")
    ratios, n_hash = compress_ratios(c), hash_layers(c)
    for i, r in enumerate(ratios):
        yield from _block(c, f"layers.{i}", i, r, i < n_hash, mtp=False)
    yield TensorGroup("norm", (H,), "norms", dtype="bf16", is_matrix=False)
    yield TensorGroup("head", (V, H), "head")
    yield TensorGroup("hc_head_fn", (hc, hc * H), "mhc", dtype="f32", is_matrix=False)
    yield TensorGroup("hc_head_base", (hc,), "mhc", dtype="f32", is_matrix=False)
    yield TensorGroup("hc_head_scale", (1,), "mhc", dtype="f32", is_matrix=False)
    for m in range(c.get("num_nextn_predict_layers", 0)):
        p = f"mtp.{m}"
        yield TensorGroup(f"{p}.e_proj", (H, H), "mtp.proj", mtp=True)
        yield TensorGroup(f"{p}.h_proj", (H, H), "mtp.proj", mtp=True)
        for nrm in ("enorm", "hnorm", "norm"):
            yield TensorGroup(f"{p}.{nrm}", (H,), "norms", mtp=True, is_matrix=False)
        yield TensorGroup(f"{p}.hc_head_fn", (hc, hc * H), "mhc", mtp=True, dtype="f32", is_matrix=False)
        yield TensorGroup(f"{p}.hc_head_base", (hc,), "mhc", mtp=True, dtype="f32", is_matrix=False)
        yield TensorGroup(f"{p}.hc_head_scale", (1,), "mhc", mtp=True, dtype="f32", is_matrix=False)
        # vLLM builds the MTP block with compress ratio 1: no compressor, no indexer.
        yield from _block(c, p, len(ratios) + m, 1, hash_routed=False, mtp=True)


def source_scheme(group: TensorGroup, source_format: str) -> Scheme:
    """Stored format of a DeepSeek-V4 group in one of the three known layouts."""
    if not group.is_matrix:
        return Scheme.PASSTHROUGH
    if source_format == "bf16":
        return Scheme.BF16
    if group.role == "routed_experts":
        return Scheme.MXFP4 if source_format == "official" else Scheme.NVFP4
    if group.role.startswith("attn.") or group.role in ("shared_experts", "indexer.wq_b", "mtp.proj"):
        return Scheme.FP8_BLOCK
    return Scheme.BF16
