"""DeepSeek-V4 tensor-name layouts and the explicit mappings between them.

Three layouts:

- ``native``: DeepSeek's own names (``layers.L.attn.wq_a.weight``, ``layers.L.ffn.experts.E.w1.weight``,
  ``mtp.0.*``). The official release, modelopt's DSV4 exporter and vLLM's V4 loader use these.
- ``hf``: transformers' ``DeepseekV4ForCausalLM`` parameter names (``model.layers.L.self_attn.q_a_proj.weight``,
  fused ``model.layers.L.mlp.experts.gate_up_proj`` [E, 2I, H]). transformers has no MTP module, so
  ``mtp.*`` has no hf name. The table mirrors transformers 5.19 ``conversion_mapping.py`` ("deepseek_v4");
  tests/checkpoint/test_layouts.py checks it against transformers' own loader.
- ``unified``: what transformers' ``save_pretrained`` and modelopt's generic ``export_hf_checkpoint``
  (modelopt/torch/export/unified_export_hf.py: ``export_hf_checkpoint`` -> ``_export_transformers_checkpoint``,
  which saves through transformers) write: transformers' *reverse* conversion of the hf names. That is
  ``model.`` + the native name for layer tensors, ``model.embed_tokens`` / ``model.norm`` /
  ``model.hc_head.hc_*`` / ``head`` at the top, per-expert ``ffn.experts.E.wK``, and one quirk: the
  main attention's ``kv_norm`` comes back as ``attn.norm`` (the reverse of the compressor's
  ``.norm. -> .kv_norm.`` rule). vLLM rejects that name; native is ``attn.kv_norm``.

The seed team's serving failures were all mismatches of this kind (mlp vs ffn, gate_proj vs w1,
self_attn vs attn, kv_norm placement, position_bias): every pair is spelled out once, here.
"""
from __future__ import annotations

import re
from typing import Mapping

import torch

# Per-layer suffix pairs (native, hf). Order matters only for readability; each native suffix is unique.
_LAYER_PAIRS: tuple[tuple[str, str], ...] = (
    ("attn.wq_a.weight", "self_attn.q_a_proj.weight"),
    ("attn.wq_b.weight", "self_attn.q_b_proj.weight"),
    ("attn.wkv.weight", "self_attn.kv_proj.weight"),
    ("attn.wo_a.weight", "self_attn.o_a_proj.weight"),
    ("attn.wo_b.weight", "self_attn.o_b_proj.weight"),
    ("attn.q_norm.weight", "self_attn.q_a_norm.weight"),
    # main-attention kv_norm keeps its name; the *compressor's* 'norm' becomes 'kv_norm' in hf
    ("attn.kv_norm.weight", "self_attn.kv_norm.weight"),
    ("attn.attn_sink", "self_attn.sinks"),
    ("attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight"),
    ("attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight"),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),
    ("attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    ("attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    ("attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("ffn.gate.weight", "mlp.gate.weight"),
    ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"),
    ("ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"),
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("hc_attn_fn", "attn_hc.fn"),
    ("hc_attn_base", "attn_hc.base"),
    ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"),
    ("hc_ffn_base", "ffn_hc.base"),
    ("hc_ffn_scale", "ffn_hc.scale"),
)
_TOP_PAIRS: tuple[tuple[str, str], ...] = (
    ("embed.weight", "model.embed_tokens.weight"),
    ("head.weight", "lm_head.weight"),
    ("norm.weight", "model.norm.weight"),
    ("hc_head_fn", "model.hc_head.hc_fn"),
    ("hc_head_base", "model.hc_head.hc_base"),
    ("hc_head_scale", "model.hc_head.hc_scale"),
)
_N2H_LAYER = dict(_LAYER_PAIRS)
_H2N_LAYER = {h: n for n, h in _LAYER_PAIRS}
_N2H_TOP = dict(_TOP_PAIRS)
_H2N_TOP = {h: n for n, h in _TOP_PAIRS}

_NATIVE_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_NATIVE_EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")
_HF_FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


class LayoutError(KeyError):
    """A tensor name that the requested layout mapping does not know."""


def _unknown(name: str, src: str, dst: str) -> LayoutError:
    return LayoutError(
        f"tensor {name!r}: no {src} -> {dst} name mapping (expected a DeepSeek-V4 {src} name, see "
        f"nvfp4stack/models/deepseek_v4/layouts.py); fix the name or add the pair to _LAYER_PAIRS/_TOP_PAIRS"
    )


def is_mtp(native_name: str) -> bool:
    return native_name.startswith("mtp.")


def native_to_hf(name: str) -> str | None:
    """HF name of one native non-expert tensor; None for MTP tensors (transformers has no MTP)."""
    if is_mtp(name):
        return None
    if name in _N2H_TOP:
        return _N2H_TOP[name]
    m = _NATIVE_LAYER.match(name)
    if m and m.group(2) in _N2H_LAYER:
        return f"model.layers.{m.group(1)}.{_N2H_LAYER[m.group(2)]}"
    raise _unknown(name, "native", "hf")


def hf_to_native(name: str) -> str:
    """Native name of one HF non-expert tensor."""
    if name in _H2N_TOP:
        return _H2N_TOP[name]
    m = _HF_LAYER.match(name)
    if m and m.group(2) in _H2N_LAYER:
        return f"layers.{m.group(1)}.{_H2N_LAYER[m.group(2)]}"
    raise _unknown(name, "hf", "native")


_N2U_TOP = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
            "head.weight": "head.weight", "hc_head_fn": "model.hc_head.hc_fn",
            "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
_U2N_TOP = {u: n for n, u in _N2U_TOP.items()}
_KV_NORM_NATIVE = re.compile(r"^(layers\.\d+\.)attn\.kv_norm\.weight$")
_KV_NORM_UNIFIED = re.compile(r"^model\.(layers\.\d+\.)attn\.norm\.weight$")


def native_to_unified(name: str) -> str | None:
    """Unified (transformers-save / modelopt generic export) name of one native tensor; None for MTP."""
    if is_mtp(name):
        return None
    if name in _N2U_TOP:
        return _N2U_TOP[name]
    m = _KV_NORM_NATIVE.match(name)
    if m:
        return f"model.{m.group(1)}attn.norm.weight"
    if _NATIVE_LAYER.match(name) and (_NATIVE_EXPERT.match(name) or name.split(".", 2)[2] in _N2H_LAYER):
        return "model." + name
    raise _unknown(name, "native", "unified")


def unified_to_native(name: str) -> str:
    if name in _U2N_TOP:
        return _U2N_TOP[name]
    m = _KV_NORM_UNIFIED.match(name)
    if m:
        return f"{m.group(1)}attn.kv_norm.weight"
    if name.startswith("model.layers."):
        native = name[len("model."):]
        if native.split(".", 2)[2] in _N2H_LAYER and not native.endswith("attn.kv_norm.weight"):
            return native
        if _NATIVE_EXPERT.match(native):
            return native
    raise _unknown(name, "unified", "native")


def native_state_to_hf(native: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Native state dict -> transformers state dict: renames, and stacks routed experts.

    ``gate_up_proj[e] = cat(w1, w3)`` along the output dim [E, 2I, H]; ``down_proj[e] = w2`` [E, H, I]
    (transformers' MergeModulelist(dim=0) + Concatenate(dim=1)). MTP tensors are dropped.
    """
    out: dict[str, torch.Tensor] = {}
    experts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in native.items():
        m = _NATIVE_EXPERT.match(name)
        if m:
            experts.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), {})[m.group(3)] = t
            continue
        hf = native_to_hf(name)
        if hf is not None:
            out[hf] = t
    for layer, per_e in experts.items():
        n_e = len(per_e)
        missing = [f"layers.{layer}.ffn.experts.{e}.{w}.weight" for e in range(n_e)
                   for w in ("w1", "w2", "w3") if w not in per_e.get(e, {})]
        if missing:
            raise LayoutError(
                f"layer {layer}: routed experts are incomplete, missing {missing[:4]} "
                f"({len(missing)} in all); every expert needs w1, w2 and w3"
            )
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([per_e[e]["w1"], per_e[e]["w3"]], dim=0) for e in range(n_e)])
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.stack([per_e[e]["w2"] for e in range(n_e)])
    return out


def hf_state_to_native(hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Transformers state dict -> native state dict (inverse of :func:`native_state_to_hf`)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in hf.items():
        m = _HF_FUSED.match(name)
        if not m:
            out[hf_to_native(name)] = t
            continue
        layer, which = m.groups()
        for e in range(t.shape[0]):
            p = f"layers.{layer}.ffn.experts.{e}"
            if which == "down_proj":
                out[f"{p}.w2.weight"] = t[e]
            else:
                w1, w3 = t[e].chunk(2, dim=0)  # [2I, H] -> gate rows then up rows
                out[f"{p}.w1.weight"], out[f"{p}.w3.weight"] = w1, w3
    return out


def native_expert_name(layer: int | str, expert: int, w: str, prefix: str = "layers") -> str:
    """``layers.L.ffn.experts.E.wK`` (no suffix): the group prefix of one routed-expert projection."""
    return f"{prefix}.{layer}.ffn.experts.{expert}.{w}"


# Suffixes a quantized group adds next to (or instead of) '.weight'.
QUANT_SUFFIXES = (".weight_scale_2", ".weight_scale", ".input_scale", ".scale")


def map_name(name: str, fn) -> str | None:
    """Apply a base-name mapping (e.g. native_to_unified) to any tensor of a group, scales included."""
    for suf in QUANT_SUFFIXES:
        if name.endswith(suf):
            base = fn(name[: -len(suf)] + ".weight")
            return None if base is None else base[: -len(".weight")] + suf
    return fn(name)
