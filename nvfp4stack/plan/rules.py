"""Precision rules with llm-compressor semantics: ordered {targets, ignore, scheme}; ignore wins."""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable

from nvfp4stack.plan.roles import ROLES, role_covers
from nvfp4stack.schemes import Scheme


@lru_cache(maxsize=None)
def _regex(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def _check_regex(target: str) -> None:
    if not target.startswith("re:"):
        return
    try:
        _regex(target[3:])
    except re.error as e:
        raise ValueError(  # the target as typed (no repr): its backslashes are the regex's
            f"precision.rules: target '{target}' is not a valid regex ({e}); fix the regex after 're:' (a literal "
            "( [ . needs a backslash: \\( \\[ \\.), or give a role, a tensor-group name or a glob") from None


def target_matches(target: str, name: str, role: str | None, mtp: bool) -> bool:
    """One target against one tensor group.

    ``re:<regex>`` searches the name; a pattern with ``*?[`` is an fnmatch on the name;
    ``mtp`` names the whole MTP block; otherwise the target is an exact name or a role.
    """
    if target.startswith("re:"):
        return bool(_regex(target[3:]).search(name))
    if any(ch in target for ch in "*?["):
        return fnmatch.fnmatchcase(name, target)
    if target == "mtp":
        return mtp
    return name == target or (role is not None and role_covers(target, role))


@dataclass
class PrecisionRule:
    """Apply ``scheme`` to groups matching any of ``targets`` and none of ``ignore``."""

    targets: list[str] = field(default_factory=list)
    scheme: str = "passthrough"
    ignore: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError(
                "precision.rules: a rule has no targets; give targets: [<role>|<name>|re:<regex>|<glob>] "
                f"(roles: {', '.join(ROLES)}, mtp)"
            )
        for t in [*self.targets, *self.ignore]:
            _check_regex(t)
        Scheme.parse(self.scheme, where=f"precision.rules[targets={self.targets}].scheme")

    def matches(self, name: str, role: str | None, mtp: bool) -> bool:
        if any(target_matches(t, name, role, mtp) for t in self.ignore):
            return False
        return any(target_matches(t, name, role, mtp) for t in self.targets)

    def targets_matching(self, name: str, role: str | None, mtp: bool) -> list[str]:
        """The targets of this rule that match (used to warn about targets that match nothing)."""
        return [t for t in self.targets if target_matches(t, name, role, mtp)]


def unmatched_target(index: int, target: str, model: str, names: Iterable[str]) -> str:
    """The warning for ``precision.rules[index]``'s ``target`` matching no tensor group of ``model``;
    ``names`` (roles and group names) feed the "did you mean"."""
    from nvfp4stack.usage import did_you_mean

    hint = did_you_mean(target, sorted(set(names))) if not target.startswith("re:") else ""
    return (f"precision.rules[{index}] target {target!r} matches no tensor group of {model}{hint} "
            "(targets: a role, a tensor-group name, re:<regex> or a glob; `plan` lists the roles)")


def first_match(rules: list[PrecisionRule], name: str, role: str | None, mtp: bool) -> PrecisionRule | None:
    """The first rule that applies: earlier rules win, so put specific rules first."""
    for rule in rules:
        if rule.matches(name, role, mtp):
            return rule
    return None
