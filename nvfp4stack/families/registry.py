"""The model-family registry: the one place the core finds a family (by name, architecture, factory).

The plug-ins live in ``PLUGINS`` (nvfp4stack/models/): each line of its ``PACKAGES`` names a package
whose ``FAMILY`` is a ``ModelFamily``; adding a family adds one line there. They are imported on the
first lookup, never at import of this module: the contract sits below its plug-ins.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path
from typing import Callable

from nvfp4stack.families.family import ModelFamily
from nvfp4stack.families.roles import GENERIC_ROLES

# The package of the family plug-ins: ``PACKAGES`` lists them, ``DESCRIPTORS`` is the folder of the
# weight-free config.json descriptors they share.
PLUGINS = "nvfp4stack.models"


def plugins():
    """The plug-in package (``PLUGINS``), imported on first use."""
    return importlib.import_module(PLUGINS)


@lru_cache(maxsize=1)
def _families() -> dict[str, ModelFamily]:
    out: dict[str, ModelFamily] = {}
    for pkg in plugins().PACKAGES:
        fam = importlib.import_module(pkg).FAMILY
        if not isinstance(fam, ModelFamily) or not fam.name:
            raise TypeError(f"{pkg}.FAMILY: expected a named ModelFamily instance, found {fam!r}")
        if fam.name in out:
            raise ValueError(f"model family {fam.name!r} is registered twice ({pkg}); give one another name")
        out[fam.name] = fam
    return out


def family_names() -> list[str]:
    return list(_families())


def families() -> list[ModelFamily]:
    return list(_families().values())


def get_family(name: str, key: str = "model.family") -> ModelFamily:
    """The family called ``name``; the error lists the valid ones."""
    try:
        return _families()[name]
    except KeyError:
        raise ValueError(f"{key}={name!r} is not a registered model family; valid: "
                         f"{', '.join(family_names())} (nvfp4stack/models/__init__.py PACKAGES)") from None


def family_for_config(hf: dict, where: str = "config.json") -> ModelFamily:
    """The family serving a config.json (its ``architectures``, else its ``model_type``)."""
    archs = hf.get("architectures") or []
    for fam in families():
        if any(a in fam.hf_architectures for a in archs):
            return fam
    for fam in families():
        if hf.get("model_type") in fam.model_types:
            return fam
    known = sorted({a for f in families() for a in f.hf_architectures})
    raise ValueError(f"{where}: architectures {archs} / model_type {hf.get('model_type')!r} belong to no "
                     f"registered model family; expected one of: {', '.join(known)}")


@lru_cache(maxsize=1)
def _factories() -> dict[str, tuple[ModelFamily, Callable[[Path, str], Path]]]:
    out: dict[str, tuple[ModelFamily, Callable[[Path, str], Path]]] = {}
    for fam in families():
        for name, build in fam.factories().items():
            if name in out:
                raise ValueError(f"model.factory {name!r} is declared by {out[name][0].name} and {fam.name}")
            out[name] = (fam, build)
    return out


def factories() -> dict[str, Callable[[Path, str], Path]]:
    """factory name -> builder(cache root, source_format) -> checkpoint dir, over every family."""
    return {name: build for name, (_, build) in _factories().items()}


def servable_factories() -> list[str]:
    return [n for f in families() for n in f.serve_factories]


def factory_names() -> list[str]:
    return list(_factories())


def get_factory(name: str) -> tuple[ModelFamily, Callable[[Path, str], Path]]:
    """(family, builder) of ``model.factory=name``; the error lists the valid factories."""
    try:
        return _factories()[name]
    except KeyError:
        raise ValueError(f"model.factory={name!r} is unknown; valid: {', '.join(factory_names())}") from None


def shape_twins() -> dict[str, str]:
    return {k: v for f in families() for k, v in f.shape_twins.items()}


def train_budgets() -> dict[str, tuple[int, str]]:
    return {k: v for f in families() for k, v in f.train_budgets.items()}


def train_budget(factory: str) -> tuple[int | None, str | None]:
    """(default train.steps, what that budget took when measured) of a trainable factory."""
    return train_budgets().get(factory, (None, None))


def all_roles() -> tuple[str, ...]:
    """Every role of every family (generic first), for rule validation."""
    seen = dict.fromkeys(GENERIC_ROLES)
    for fam in families():
        seen.update(dict.fromkeys(fam.roles))
    return tuple(seen)


def precision_keys() -> dict[str, None]:
    """Every family's precision keys beyond the generic ones, in a stable order ('attn.wq', 'x.y', ...)."""
    keys: dict[str, None] = {}
    for fam in families():
        keys.update(dict.fromkeys((*fam.attn_roles, *fam.extra_roles)))
    return keys


def gate_up_pairs() -> tuple[tuple[str, str], ...]:
    """Every family's (gate, up) projection-name pairs, registry order, each once: for code that
    sees a tensor group without knowing its family (the w13 converter under convert.rules)."""
    return tuple(dict.fromkeys(pair for fam in families() for pair in fam.gate_up_pairs))


def role_of(name: str, family: str | None = None) -> str | None:
    """The role of a tensor/module name by ``family``'s patterns; without a family, by the first
    family whose own patterns match, then the generic ones (pass the family where it is known)."""
    if family is not None:
        return get_family(family).role_of(name)
    probe = "." + name
    for fam in families():
        for role, pat in fam.compiled_patterns()[: len(fam.role_patterns)]:
            if pat.search(probe):
                return role
    return ModelFamily().role_of(name)
