"""Module roles: the generic vocabulary plus every registered family's roles, one lookup for all layouts."""
from __future__ import annotations

from nvfp4stack.families.registry import all_roles, families, get_family, role_of  # noqa: F401  (role_of: re-export)

# Every role a precision rule can name. Dotted roles form a tree: a rule naming a prefix
# ('attn') covers every role below it ('attn.<proj>').
ROLES = all_roles()


def non_matrix_roles(family: str | None = None) -> frozenset[str]:
    """Roles whose tensors are never GEMM weights: ``norms`` plus the family's (all families' when None)."""
    fams = [get_family(family)] if family else families()
    return frozenset({"norms", *(r for f in fams for r in f.non_matrix_roles)})


def is_mtp(name: str, num_hidden_layers: int | None = None, family: str | None = None) -> bool:
    """True for multi-token-prediction tensors by ``family``'s ``ModelFamily.is_mtp`` (its native MTP
    module, or decoder layers past ``num_hidden_layers``); without a family, by any registered family's."""
    if family is not None:
        return get_family(family).is_mtp(name, num_hidden_layers)
    return any(f.is_mtp(name, num_hidden_layers) for f in families())


def role_covers(target: str, role: str) -> bool:
    """A rule target naming a role covers that role and every role below it ('attn' covers 'attn.<proj>')."""
    return role == target or role.startswith(target + ".")
