"""A toy model family registered for one test: shows that the core takes a family's declarations
(gate/up names, MTP module, MTP layer count, ...) from the family rather than knowing them."""
from __future__ import annotations

from nvfp4stack.families import registry
from nvfp4stack.families.family import ModelFamily


def toy_family(name: str = "toy", **attrs) -> ModelFamily:
    """A ``ModelFamily`` called ``name`` with ``attrs`` as class attributes (or methods), unregistered."""
    return type("ToyFamily", (ModelFamily,), {"name": name, **attrs})()


def register_toy_family(monkeypatch, name: str = "toy", **attrs) -> ModelFamily:
    """Register :func:`toy_family` next to the real families until the test ends; returns it."""
    toy = toy_family(name, **attrs)
    real = registry._families()
    monkeypatch.setattr(registry, "_families", lambda: {**real, name: toy})
    return toy
