"""``quantize`` task: the model family's quantize pipeline (modelopt PTQ or a data-free cast)."""
from __future__ import annotations


def run(cfg) -> int:
    """Quantize per cfg.quantize; returns the family pipeline's exit code."""
    from nvfp4stack.models.registry import get_family

    return get_family(cfg.model.family).quantize(cfg)
