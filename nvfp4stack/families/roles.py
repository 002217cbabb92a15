"""Roles and naming: what a precision key names, how a tensor name maps to a role, the hard rules."""
from __future__ import annotations

import re
from functools import lru_cache

from nvfp4stack.families.contract import FamilyIdentity, TensorGroup

# Roles every family shares; families add theirs (attn_roles, extra_roles, non_matrix_roles).
# Dotted roles form a tree: a rule naming 'attn' covers every 'attn.*' role. 'mtp.proj' (the MTP
# block's input projections) has no generic name: each family with MTP maps its own names to it.
GENERIC_ROLES = ("routed_experts", "shared_experts", "dense_mlp", "gate", "gate.bias",
                 "embed", "head", "mtp.proj", "norms")
# Precision keys of the generic matrix roles (precision.<role>).
GENERIC_PRECISION_ROLES = ("routed_experts", "shared_experts", "dense_mlp", "gate", "embed", "head")

# Generic name -> role patterns: transformers' and vLLM's MoE layout (model.layers.N.mlp.*,
# embed_tokens, lm_head), tried after the family's own (first match wins). A family whose names
# differ (another module name, projection names, router bias, MTP) adds them to its role_patterns.
GENERIC_PATTERNS: tuple[tuple[str, str], ...] = (
    ("shared_experts", r"\.mlp\.shared_experts?(\.|$)"),
    ("routed_experts", r"\.mlp\.experts(\.|$)"),
    ("dense_mlp", r"\.mlp\.(gate_proj|up_proj|down_proj|gate_up_proj)(\.|$)"),
    ("gate.bias", r"\.mlp\.gate\.bias$"),
    ("gate", r"\.mlp\.gate(\.weight|$)"),
    ("embed", r"(^|\.)embed_tokens(\.weight)?$"),
    ("head", r"(^|\.)lm_head(\.weight)?$"),
    ("norms", r"norm(\.weight|\.bias)?$|layernorm(\.weight)?$"),
)

# A decoder layer's number in any layout ('layers.3.', 'model.layers.3.').
_DECODER_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")


@lru_cache(maxsize=None)
def _mtp_module_pattern(module: str) -> re.Pattern:
    """``<module>.<N>.`` under any parent prefix."""
    return re.compile(rf"(^|\.){re.escape(module)}\.\d+\.")


class SupportsRoles(FamilyIdentity):
    """Roles (what a precision key names; see ``GENERIC_ROLES`` and ``GENERIC_PATTERNS``).

    ``attn_roles``         attention projections as ``attn.<proj>`` roles; each one is the precision key
                           ``precision.attn.<proj>``. Use the projection's own short name.
    ``extra_roles``        family-only matrix roles, each a precision key (dotted = nested:
                           ``sparse.wq`` is ``precision.sparse.wq``).
    ``non_matrix_roles``   roles of stored tensors that are no GEMM weight (besides ``norms``).
    ``role_patterns``      ``(role, regex)`` tried on ``"." + tensor_or_module_name`` before the generic
                           patterns, first match wins. Cover every layout the family's names come in
                           (native, transformers, vLLM module prefixes).
    ``unquantized_roles``  matrix roles vLLM builds with ``quant_config=None``: the planner refuses any
                           target but bf16 for them; the doctor does not compare their served format.
    ``tp_sharded_roles``   roles vLLM splits across tensor-parallel ranks (memory plan); everything
                           else is counted replicated. Generic default: shared experts, embed, head.
    ``check_hard_rules``   family rules as ``PlanError`` (name the tensor, the role, the key and the fix).
    ``mtp_module``         the native multi-token-prediction module: its tensors are ``<mtp_module>.<N>.*``
                           (under any parent prefix). Generic default ``""``: the MTP layers are only the
                           decoder layers numbered past ``num_hidden_layers`` (transformers' and vLLM's
                           layout), which ``is_mtp`` counts for every family.
    ``gate_up_pairs``      a routed expert's (gate, up) projection names, one pair per layout the family's
                           checkpoints come in; the planner gives each pair one NVFP4 global scale (fused
                           gate_up kernels read one). Generic default: ``(("gate_proj", "up_proj"),)``.
    """

    attn_roles: tuple[str, ...] = ()
    extra_roles: tuple[str, ...] = ()
    non_matrix_roles: tuple[str, ...] = ()
    role_patterns: tuple[tuple[str, str], ...] = ()
    unquantized_roles: tuple[str, ...] = ()
    tp_sharded_roles: tuple[str, ...] = ("shared_experts", "embed", "head")
    gate_up_pairs: tuple[tuple[str, str], ...] = (("gate_proj", "up_proj"),)
    mtp_module: str = ""

    @property
    def roles(self) -> tuple[str, ...]:
        """Every role this family's tensors can have."""
        return (*GENERIC_ROLES, *self.attn_roles, *self.extra_roles, *self.non_matrix_roles)

    @property
    def precision_roles(self) -> tuple[str, ...]:
        """The precision keys (flat, dotted) that name one of this family's matrix roles."""
        return (*GENERIC_PRECISION_ROLES, *self.attn_roles, *self.extra_roles)

    def compiled_patterns(self) -> list[tuple[str, re.Pattern]]:
        """The family's own patterns, then the generic ones, compiled once per family."""
        cached = self.__dict__.get("_compiled")
        if cached is None:
            cached = [(r, re.compile(p)) for r, p in (*self.role_patterns, *GENERIC_PATTERNS)]
            self.__dict__["_compiled"] = cached
        return cached

    def role_of(self, name: str) -> str | None:
        """The role of a tensor or module name in any layout of this family, or None."""
        probe = "." + name
        for role, pat in self.compiled_patterns():
            if pat.search(probe):
                return role
        return None

    def is_mtp(self, name: str, num_hidden_layers: int | None = None) -> bool:
        """True for a multi-token-prediction tensor or module name: under the family's ``mtp_module``
        (``mtp.0.ffn...``), or a decoder layer numbered ``num_hidden_layers`` or higher."""
        if self.mtp_module and _mtp_module_pattern(self.mtp_module).search(name):
            return True
        if num_hidden_layers is None:
            return False
        m = _DECODER_LAYER.search(name)
        return bool(m) and int(m.group(2)) >= num_hidden_layers

    def check_hard_rules(self, group: TensorGroup, source, target) -> None:
        """Raise ``PlanError`` when storing ``group`` as ``target`` breaks a rule of this family."""
