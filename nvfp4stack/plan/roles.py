"""Module roles: the generic vocabulary plus every registered family's roles, one lookup for all layouts.

The functions take the model family as an object (a ``SupportsRoles``, resolved once where the name
comes in); None asks every registered family, for code that sees a name without knowing its family."""
from __future__ import annotations

from nvfp4stack.families import registry
from nvfp4stack.families.roles import SupportsRoles

# Every role a precision rule can name. Dotted roles form a tree: a rule naming a prefix
# ('attn') covers every role below it ('attn.<proj>').
ROLES = registry.all_roles()


def role_of(name: str, family: SupportsRoles | None = None) -> str | None:
    """The role of a tensor/module name by ``family``'s patterns (``ModelFamily.role_of``); without a
    family, by the first registered family whose own patterns match, then the generic ones."""
    return family.role_of(name) if family is not None else registry.role_of(name)


def non_matrix_roles(family: SupportsRoles | None = None) -> frozenset[str]:
    """Roles whose tensors are never GEMM weights: ``norms`` plus the family's (all families' when None)."""
    fams = [family] if family is not None else registry.families()
    return frozenset({"norms", *(r for f in fams for r in f.non_matrix_roles)})


def is_mtp(name: str, num_hidden_layers: int | None = None, family: SupportsRoles | None = None) -> bool:
    """True for multi-token-prediction tensors by ``family``'s ``ModelFamily.is_mtp`` (its native MTP
    module, or decoder layers past ``num_hidden_layers``); without a family, by any registered family's."""
    if family is not None:
        return family.is_mtp(name, num_hidden_layers)
    return any(f.is_mtp(name, num_hidden_layers) for f in registry.families())


def role_covers(target: str, role: str) -> bool:
    """A rule target naming a role covers that role and every role below it ('attn' covers 'attn.<proj>')."""
    return role == target or role.startswith(target + ".")
