"""Converter contract: a pure function on one tensor group, registered by name."""
from __future__ import annotations

from typing import ClassVar

from nvfp4stack.registry import Registry
from nvfp4stack.schemes import Scheme


class Converter:
    """Turns one tensor group from ``source`` format into ``target`` format.

    ``convert(tensors, name)`` takes the group's tensors keyed by suffix (e.g. 'weight',
    'scale', 'weight_scale', 'weight_scale_2', 'input_scale') and returns the new group,
    keyed by the suffixes the target layout uses. ``name`` is the group's checkpoint prefix,
    used in error messages.
    """

    name: ClassVar[str] = ""
    source: ClassVar[Scheme]
    target: ClassVar[Scheme]

    def convert(self, tensors: dict, name: str) -> dict:  # pragma: no cover - interface
        raise NotImplementedError


CONVERTERS: Registry[type[Converter]] = Registry("converter")
