"""Converters, one per file; importing this package registers all of them in CONVERTERS (the
model families' own converters too)."""
from nvfp4stack.convert import (  # noqa: F401  (imported for registration)
    bf16_to_fp8_block,
    bf16_to_nvfp4,
    fp8_block_to_bf16,
    mxfp4_to_bf16,
    mxfp4_to_fp8_block,
    mxfp4_to_nvfp4,
    nvfp4_to_bf16,
    nvfp4_to_fp8_block,
    w13_shared_global_scale,
)
from nvfp4stack.convert.base import CONVERTERS, Converter
from nvfp4stack.families.registry import families


def _register_family_converters() -> None:
    import importlib

    for fam in families():
        for module in fam.converter_modules:
            importlib.import_module(module)


_register_family_converters()

__all__ = ["CONVERTERS", "Converter"]
