"""The conversion plan as work units: which tensors are read, converted and written together.

A unit is one module's tensors under one converter (or the modules a multi-module converter
fuses, or one pass-through tensor's group); units keep the input's storage order, so the output
layout depends only on the input and the rules.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Mapping

from nvfp4stack.convert.base import CONVERTERS
from nvfp4stack.schemes import Scheme

PASSTHROUGH = "passthrough"
Chooser = Callable[[str], "str | None"]


@dataclass
class Unit:
    """Tensors converted together: ``prefix`` + '.' + local key is the checkpoint name."""

    converter: str
    prefix: str
    members: list = field(default_factory=list)  # (checkpoint name, local key)


def split_name(name: str) -> tuple[str, str]:
    """'layers.0.attn.wkv.weight' -> ('layers.0.attn.wkv', 'weight')."""
    module, _, suffix = name.rpartition(".")
    return module, suffix


def join_name(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def parse_rules(rules, where: str = "rules") -> dict[str, str]:
    """A mapping, or 'glob=converter' strings (order kept) -> {glob: converter}."""
    if isinstance(rules, Mapping):
        return dict(rules)
    out = {}
    for r in rules:
        pattern, sep, conv = str(r).partition("=")
        if not sep or not pattern or not conv:
            raise ValueError(f"{where}: expected 'glob=converter' entries, found {r!r}; e.g. "
                             "'*.ffn.experts.*=bf16_to_nvfp4'")
        out[pattern.strip()] = conv.strip()
    return out


def chooser_from_rules(rules) -> Chooser:
    """Glob patterns on module names -> converter name or 'passthrough'; no match -> None."""
    items = list(parse_rules(rules).items())

    def choose(module: str) -> str | None:
        for pattern, conv in items:
            if fnmatch.fnmatchcase(module, pattern):
                return conv
        return None

    return choose


def plan_units(names: list[str], choose: Chooser) -> tuple[list[Unit], list[str]]:
    """Group tensor names into work units in first-appearance order; also return unknown names."""
    units: dict[tuple[str, str], Unit] = {}
    unknown: list[str] = []
    decided: dict[str, str | None] = {}
    for name in names:
        module, suffix = split_name(name)
        if module not in decided:
            decided[module] = choose(module)
        conv = decided[module]
        if conv is None and choose(name) == PASSTHROUGH:
            conv = PASSTHROUGH  # a parameter stored without a suffix (attn_sink) is a group of its own
        if conv is None:
            unknown.append(name)
            conv = PASSTHROUGH
        if conv == PASSTHROUGH:
            key, local = (PASSTHROUGH, name), name
        elif getattr(CONVERTERS.get(conv), "spans_modules", False):
            parent, last = split_name(module)
            key, local = (conv, parent), f"{last}.{suffix}"
        else:
            key, local = (conv, module), suffix
        units.setdefault(key, Unit(key[0], key[1])).members.append((name, local))
    return list(units.values()), unknown


def unit_sources(units: list[Unit]) -> dict[str, Scheme]:
    """group -> the format its converter reads (a converter fusing modules reads several: skipped)."""
    out = {}
    for u in units:
        conv = CONVERTERS.get(u.converter) if u.converter != PASSTHROUGH else None
        if conv is not None and not getattr(conv, "spans_modules", False):
            out[u.prefix] = conv.source
    return out
