"""Module roles: one vocabulary for DeepSeek-native, transformers-HF and vLLM tensor names."""
from __future__ import annotations

import re

# Every role a precision rule can name. Dotted roles form a tree: a rule naming 'attn'
# or 'indexer' covers every role below it.
ROLES = (
    "routed_experts", "shared_experts", "dense_mlp", "gate", "gate.bias",
    "attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wkv_b", "attn.wo_a", "attn.wo_b",
    "compressor", "indexer.wq_b", "indexer.weights_proj",
    "embed", "head", "mtp.proj", "norms", "mhc", "attn_sink",
)

# Order matters: the first pattern that matches decides (compressor before attn.wkv, ...).
_PATTERNS: list[tuple[str, re.Pattern]] = [
    (role, re.compile(p))
    for role, p in [
        ("compressor", r"\.compressor\."),
        ("indexer.wq_b", r"\.indexer\.wq_b(\.|$)"),
        ("indexer.weights_proj", r"\.indexer\.weights_proj(\.|$)"),
        ("shared_experts", r"\.(ffn|mlp)\.shared_experts?(\.|$)"),
        ("routed_experts", r"\.(ffn|mlp)\.experts(\.|$)"),
        ("dense_mlp", r"\.(ffn|mlp)\.(gate_proj|up_proj|down_proj|w1|w2|w3)(\.|$)"),
        ("gate.bias", r"\.(ffn|mlp)\.gate\.(bias|tid2eid|e_score_correction_bias)$"),
        ("gate", r"\.(ffn|mlp)\.gate(\.weight|$)"),
        ("attn.wq_a", r"\.(attn|self_attn)\.(wq_a|q_a_proj|fused_wqa_wkv|fused_qkv_a_proj)(\.|$)"),
        ("attn.wq_b", r"\.(attn|self_attn)\.(wq_b|q_b_proj|q_proj)(\.|$)"),
        ("attn.wkv", r"\.(attn|self_attn)\.(wkv|kv_a_proj_with_mqa)(\.|$)"),
        ("attn.wkv_b", r"\.(attn|self_attn)\.kv_b_proj(\.|$)"),
        ("attn.wo_a", r"\.(attn|self_attn)\.wo_a(\.|$)"),
        ("attn.wo_b", r"\.(attn|self_attn)\.(wo_b|o_proj)(\.|$)"),
        ("attn_sink", r"\.attn_sink$|\.sinks$"),
        ("mhc", r"(^|\.)hc_(attn|ffn|head)_(fn|base|scale)$"),
        ("mtp.proj", r"(^|\.)(e_proj|h_proj|eh_proj)(\.|$)"),
        ("embed", r"(^|\.)(embed|embed_tokens)(\.weight)?$"),
        ("head", r"(^|\.)(head|lm_head)(\.weight)?$"),
        ("norms", r"norm(\.weight|\.bias)?$|layernorm(\.weight)?$"),
    ]
]

_MTP = re.compile(r"(^|\.)mtp\.\d+\.")


def role_of(name: str) -> str | None:
    """The role of a tensor or module name in any of the three layouts, or None if unknown.

    Works on native (``layers.0.ffn.experts.3.w1.weight``), transformers
    (``model.layers.0.mlp.experts.gate_up_proj``) and vLLM module prefixes
    (``model.layers.0.mlp.experts``).
    """
    probe = "." + name
    for role, pat in _PATTERNS:
        if pat.search(probe):
            return role
    return None


def is_mtp(name: str, num_hidden_layers: int | None = None) -> bool:
    """True for multi-token-prediction tensors: native ``mtp.N.``, or vLLM/HF layers past the last."""
    if _MTP.search(name):
        return True
    if num_hidden_layers is not None:
        m = re.search(r"(^|\.)layers\.(\d+)\.", name)
        return bool(m) and int(m.group(2)) >= num_hidden_layers
    return False


def role_covers(target: str, role: str) -> bool:
    """A rule target naming a role covers that role and every role below it ('attn' covers 'attn.wo_a')."""
    return role == target or role.startswith(target + ".")
