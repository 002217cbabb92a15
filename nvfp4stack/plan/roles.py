"""Module roles: the generic vocabulary plus every registered family's roles, one lookup for all layouts."""
from __future__ import annotations

import re

from nvfp4stack.models.registry import all_roles, get_family, role_of  # noqa: F401  (role_of: re-export)

# Every role a precision rule can name. Dotted roles form a tree: a rule naming a prefix
# ('attn') covers every role below it ('attn.<proj>').
ROLES = all_roles()

_MTP = re.compile(r"(^|\.)mtp\.\d+\.")


def non_matrix_roles(family: str | None = None) -> frozenset[str]:
    """Roles whose tensors are never GEMM weights: ``norms`` plus the family's (all families' when None)."""
    from nvfp4stack.models.registry import families

    fams = [get_family(family)] if family else families()
    return frozenset({"norms", *(r for f in fams for r in f.non_matrix_roles)})


def is_mtp(name: str, num_hidden_layers: int | None = None) -> bool:
    """True for multi-token-prediction tensors: native ``mtp.N.``, or vLLM/HF layers past the last."""
    if _MTP.search(name):
        return True
    if num_hidden_layers is not None:
        m = re.search(r"(^|\.)layers\.(\d+)\.", name)
        return bool(m) and int(m.group(2)) >= num_hidden_layers
    return False


def role_covers(target: str, role: str) -> bool:
    """A rule target naming a role covers that role and every role below it ('attn' covers 'attn.<proj>')."""
    return role == target or role.startswith(target + ".")
