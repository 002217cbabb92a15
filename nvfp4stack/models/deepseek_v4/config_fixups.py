"""config.json fix-ups for DeepSeek-V4: small pure functions, one job each, registered by name.

Each takes a config dict and returns a new one; none mutates its input. They exist because
transformers and vLLM read different fields (transformers 5.19 ``DeepseekV4Config`` folds the
legacy ``compress_ratios`` / ``num_hash_layers`` / ``qk_rope_head_dim`` into ``layer_types`` /
``mlp_layer_types`` / ``partial_rotary_factor`` and drops them, and drops ``topk_method``, on save;
vLLM 0.32's DeepSeek-V4 model reads the legacy ones).
"""
from __future__ import annotations

import copy
from typing import Callable, Iterable

from nvfp4stack.models.deepseek_v4.spec import DEFAULT_COMPRESS_RATES, ratios_from_layer_types
from nvfp4stack.registry import Registry

ConfigFixup = Callable[[dict], dict]
CONFIG_FIXUPS: Registry[ConfigFixup] = Registry("config fixup")

_RATIO_TO_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def _need(cfg: dict, key: str, fixup: str):
    if key not in cfg:
        raise KeyError(f"config fixup {fixup!r}: config.json has no {key!r}; it is needed to derive the "
                       f"missing field: add {key!r} (or the legacy equivalent) to config.json")
    return cfg[key]


@CONFIG_FIXUPS.register("legacy_compress_ratios")
def legacy_compress_ratios(cfg: dict) -> dict:
    """Add ``compress_ratios`` (vLLM) from ``layer_types`` + ``compress_rates`` (transformers)."""
    out = copy.deepcopy(cfg)
    if "compress_ratios" not in out:
        types = _need(out, "layer_types", "legacy_compress_ratios")
        out["compress_ratios"] = ratios_from_layer_types(types, out.get("compress_rates"))
    return out


@CONFIG_FIXUPS.register("legacy_num_hash_layers")
def legacy_num_hash_layers(cfg: dict) -> dict:
    """Add ``num_hash_layers`` (vLLM) from ``mlp_layer_types``; hash layers must come first."""
    out = copy.deepcopy(cfg)
    if "num_hash_layers" not in out:
        types = _need(out, "mlp_layer_types", "legacy_num_hash_layers")
        n = sum(t == "hash_moe" for t in types)
        if types[:n] != ["hash_moe"] * n:
            raise ValueError(f"config.json mlp_layer_types: vLLM routes layers [0, num_hash_layers) by hash, "
                             f"so hash_moe layers must come first; found {types}")
        out["num_hash_layers"] = n
    return out


@CONFIG_FIXUPS.register("transformers_layer_types")
def transformers_layer_types(cfg: dict) -> dict:
    """Add ``layer_types`` / ``compress_rates`` (transformers) from the legacy ``compress_ratios``."""
    out = copy.deepcopy(cfg)
    n = _need(out, "num_hidden_layers", "transformers_layer_types")
    if "layer_types" not in out:
        ratios = _need(out, "compress_ratios", "transformers_layer_types")[:n]
        bad = sorted({r for r in ratios if r not in _RATIO_TO_TYPE})
        if bad:
            raise ValueError(f"config.json compress_ratios: expected values in {sorted(_RATIO_TO_TYPE)}, found {bad}")
        out["layer_types"] = [_RATIO_TO_TYPE[r] for r in ratios]
        out.setdefault("compress_rates", dict(DEFAULT_COMPRESS_RATES))
    return out


@CONFIG_FIXUPS.register("drop_mlp_layer_types")
def drop_mlp_layer_types(cfg: dict) -> dict:
    """Replace ``mlp_layer_types`` by ``num_hash_layers``.

    transformers' DeepseekV4Config wants 'hash_moe'/'moe' values, but vLLM 0.32 builds the config
    with transformers' generic validator, which accepts only 'sparse'/'dense' and rejects the file.
    Without the key, transformers derives the same list from ``num_hash_layers``.
    """
    out = legacy_num_hash_layers(cfg)
    out.pop("mlp_layer_types", None)
    return out


@CONFIG_FIXUPS.register("topk_method_noaux_tc")
def topk_method_noaux_tc(cfg: dict) -> dict:
    """Restore ``topk_method: noaux_tc`` (dropped by transformers' save; vLLM needs it to load gate.bias)."""
    out = copy.deepcopy(cfg)
    found = out.get("topk_method", "noaux_tc")
    if found != "noaux_tc":
        raise ValueError(f"config.json topk_method: DeepSeek-V4 needs 'noaux_tc' (vLLM loads ffn.gate.bias "
                         f"only then), found {found!r}; set it to noaux_tc")
    out["topk_method"] = "noaux_tc"
    return out


@CONFIG_FIXUPS.register("qk_rope_head_dim")
def qk_rope_head_dim(cfg: dict) -> dict:
    """Add ``qk_rope_head_dim`` (vLLM) from ``partial_rotary_factor * head_dim`` (transformers)."""
    out = copy.deepcopy(cfg)
    if "qk_rope_head_dim" not in out:
        head = _need(out, "head_dim", "qk_rope_head_dim")
        out["qk_rope_head_dim"] = int(round(head * _need(out, "partial_rotary_factor", "qk_rope_head_dim")))
    return out


@CONFIG_FIXUPS.register("flatten_rope")
def flatten_rope(cfg: dict) -> dict:
    """Replace transformers' nested ``rope_parameters: {main, compress}`` by the flat release fields.

    vLLM 0.32 takes ``rope_parameters`` as one set of parameters (or keyed by layer type); 'main' and
    'compress' are neither. The release carries ``rope_theta`` / ``compress_rope_theta`` (+ ``rope_scaling``).
    """
    out = copy.deepcopy(cfg)
    rp = out.get("rope_parameters")
    if isinstance(rp, dict) and ("main" in rp or "compress" in rp):
        main, comp = rp.get("main", {}), rp.get("compress", {})
        out.setdefault("rope_theta", main.get("rope_theta", 10000.0))
        out["compress_rope_theta"] = comp.get("rope_theta", out.get("compress_rope_theta", 160000.0))
        if comp.get("rope_type", "default") != "default":
            out["rope_scaling"] = {k: v for k, v in comp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        del out["rope_parameters"]
    return out


@CONFIG_FIXUPS.register("moe_nvfp4")
def moe_nvfp4(cfg: dict) -> dict:
    """Mark routed experts NVFP4 the way modelopt's DSV4 exporter does (``_rewrite_config_json``).

    Keeps the FP8 quantization_config of the dense/attention path (``quant_method: fp8``, 128x128
    blocks) and adds ``moe_quant_algo: NVFP4``; ``expert_dtype`` stays ``fp4``.
    """
    out = copy.deepcopy(cfg)
    q = dict(out.get("quantization_config") or {})
    q.setdefault("activation_scheme", "dynamic")
    q["quant_method"] = "fp8"
    q.setdefault("weight_block_size", [128, 128])
    q["moe_quant_algo"] = "NVFP4"
    out["quantization_config"] = q
    out.setdefault("expert_dtype", "fp4")
    return out


@CONFIG_FIXUPS.register("fp8_block_ue8m0")
def fp8_block_ue8m0(cfg: dict) -> dict:
    """Declare 128x128 FP8 E4M3 weights with UE8M0 scales, as the DeepSeek-V4 release does
    (vLLM's DeepseekV4FP8Config reads ``quant_method: fp8`` and ``scale_fmt``)."""
    out = copy.deepcopy(cfg)
    q = dict(out.get("quantization_config") or {})
    q.update(quant_method="fp8", fmt="e4m3", scale_fmt="ue8m0", weight_block_size=[128, 128])
    q.setdefault("activation_scheme", "dynamic")
    out["quantization_config"] = q
    return out


# What a DeepSeek-V4 config.json needs to be read by both vLLM and transformers.
SERVE_FIXUPS = ("legacy_compress_ratios", "legacy_num_hash_layers", "drop_mlp_layer_types",
                "transformers_layer_types", "topk_method_noaux_tc", "qk_rope_head_dim", "flatten_rope")


def apply_fixups(cfg: dict, names: Iterable[str] = SERVE_FIXUPS) -> dict:
    """Apply the named fix-ups in order."""
    for name in names:
        cfg = CONFIG_FIXUPS.get(name)(cfg)
    return cfg


# Roles vLLM's DeepSeek-V4 builds as plain linear layers with the checkpoint's FP8 config (the others:
# routed experts are a FusedMoE, compressor / indexer.weights_proj / gate get quant_config=None, embed
# and head are no LinearBase).
FP8_CONFIG_LINEAR_ROLES = frozenset({"attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b",
                                     "shared_experts", "indexer.wq_b", "mtp.proj"})


def ignore_bf16_linears(cfg: dict, modules) -> dict:
    """List BF16-stored linear ``modules`` (native names) in ``quantization_config.ignored_layers``.

    vLLM's DeepseekV4FP8Config (an Fp8Config) builds every linear layer as FP8 block unless its
    prefix is ignored (vLLM maps the native names to its own with the model's weight mapper): a
    BF16 tensor would be cast into a float8_e4m3fn parameter and its scale left unset."""
    out = copy.deepcopy(cfg)
    q = out.get("quantization_config")
    modules = sorted(set(modules))
    if not modules or not isinstance(q, dict) or q.get("quant_method") not in ("fp8", "deepseek_v4_fp8"):
        return out
    out["quantization_config"] = {**q, "ignored_layers": sorted(set(q.get("ignored_layers") or []) | set(modules))}
    return out


def served_config(src_config: dict, targets: set, bf16_linears=()) -> dict:
    """config.json of a converted checkpoint: SERVE_FIXUPS, plus the quantization declarations the
    plan's ``targets`` ({(role, Scheme)} converted to) need; ``bf16_linears``: linear modules the
    checkpoint stores BF16 (listed as ignored by the FP8 config)."""
    from nvfp4stack.schemes import Scheme

    fixups = list(SERVE_FIXUPS)
    if any(t is Scheme.FP8_BLOCK for _, t in targets):
        fixups.append("fp8_block_ue8m0")
    if any(r == "routed_experts" and t.is_nvfp4 for r, t in targets):
        fixups.append("moe_nvfp4")
    return ignore_bf16_linears(apply_fixups(src_config, fixups), bf16_linears)
