"""``quantize`` task: the model family's quantize pipeline (modelopt PTQ or a data-free cast)."""
from __future__ import annotations


def run(cfg) -> int:
    """Quantize per cfg.quantize; returns the family pipeline's exit code."""
    from nvfp4stack.checkpoint.location import checkpoint_dir
    from nvfp4stack.families.registry import get_family

    for key in ("source", "base"):  # checked here, once for every family's pipeline
        if getattr(cfg.quantize, key):
            checkpoint_dir(f"quantize.{key}", getattr(cfg.quantize, key))
    return get_family(cfg.model.family).quantize(cfg)
