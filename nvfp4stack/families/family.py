"""ModelFamily: everything the core may ask of one model family.

A family lives in ``nvfp4stack/models/<family>/`` and exposes one ``ModelFamily`` instance as
``FAMILY`` in its ``__init__.py``; ``nvfp4stack/models/__init__.py`` lists the packages (one line
per family) and ``nvfp4stack/families/registry.py`` is the only way the core reaches a family.
Nothing outside ``models/`` names a family or one of its tensors; ``families/`` (this contract, the
registry, resolve) imports no plug-in and nothing that imports it back.

How to write a family (spec)
----------------------------
Subclass ``ModelFamily`` and set the class attributes; override a method only when the family has
that capability (the defaults say "not provided" in an error that names the family and the key).
The hooks come in small capability interfaces, each documented on its class; the core asks for the
one it uses (``plan.roles`` takes a ``SupportsRoles``):

  ``FamilyIdentity``            name, hf_architectures, model_types (``families/contract.py``)
  ``SupportsRoles``             roles, role patterns, MTP names, gate/up pairs, hard rules (``families/roles.py``)
  ``SupportsModels``            factories, shape twins, training (``families/capabilities.py``, as the rest)
  ``SupportsCheckpointLayout``  source formats and their stored schemes, own converters, served config.json
  ``SupportsPlanning``          tensor groups from config.json alone, MTP layers, KV cache and KV pool
  ``SupportsServing``           vLLM quant methods and tokenizer modes, the checkpoint a factory serves
  ``SupportsDoctor``            the doctor's family checks and vLLM load check
  ``SupportsQuantize``          the ``quantize`` pipeline and its export formats
  ``SupportsReference``         eval levels, fidelity, the served reference forward
  ``SupportsSynthetic``         synthetic weights and synthetic checkpoints for engine benchmarks

Keep heavy imports (torch, transformers, vllm, modelopt) inside methods: the registry imports every
family package to answer name lookups.
"""
from __future__ import annotations

from nvfp4stack.families.capabilities import (
    SupportsCheckpointLayout,
    SupportsDoctor,
    SupportsModels,
    SupportsPlanning,
    SupportsQuantize,
    SupportsReference,
    SupportsServing,
    SupportsSynthetic,
)
from nvfp4stack.families.roles import SupportsRoles

# Every capability ModelFamily composes, in the spec's order (the conformance test walks them).
CAPABILITIES = (SupportsRoles, SupportsModels, SupportsCheckpointLayout, SupportsPlanning, SupportsServing,
                SupportsDoctor, SupportsQuantize, SupportsReference, SupportsSynthetic)


class ModelFamily(SupportsRoles, SupportsModels, SupportsCheckpointLayout, SupportsPlanning, SupportsServing,
                  SupportsDoctor, SupportsQuantize, SupportsReference, SupportsSynthetic):
    """Base class of a model family: every capability, with its defaults; see the module docstring."""
