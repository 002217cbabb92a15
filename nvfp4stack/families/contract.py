"""The types every capability of a model family shares: the tensor group, the capability error and the
identity base the capabilities (``nvfp4stack.families.roles``, ``.capabilities``) build on."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorGroup:
    """One logical weight (``layers.3.ffn.experts.17.w1``); its stored tensors depend on the format."""

    name: str                 # prefix without the '.weight' suffix for matrices
    shape: tuple[int, ...]    # logical [out_features, in_features] for matrices
    role: str                 # a generic role or one the family declares
    mtp: bool = False         # part of the multi-token-prediction block
    dtype: str = "bf16"       # logical (unquantized) dtype: bf16, f32 or i64
    is_matrix: bool = True    # a GEMM weight that a quantization scheme can apply to

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class FamilyCapabilityError(ValueError):
    """A command asked a family for something it does not provide."""


class FamilyIdentity:
    """Who the family is; the base of every capability.

    ``name``               the ``model.family`` value (conf/model/*.yaml), e.g. ``"qwen3_moe"``.
    ``hf_architectures``   config.json ``architectures`` values it serves (``Qwen3MoeForCausalLM``).
    ``model_types``        config.json ``model_type`` values (``qwen3_moe``).
    """

    name: str = ""
    hf_architectures: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()

    def capability_missing(self, what: str, key: str, expected: str) -> FamilyCapabilityError:
        return FamilyCapabilityError(
            f"{key}: model family {self.name!r} provides no {what}; expected {expected}. Fix: pick a "
            f"model of a family that has it, or add {what} to nvfp4stack/models/{self.name}/")

    def __repr__(self) -> str:
        return f"<model family {self.name}>"
