"""The reference forward of what a server serves: transformers' model with the checkpoint's own weights.

A served checkpoint stores some groups quantized (NVFP4 experts, FP8-block attention, ...). Its
reference is transformers' forward of the BF16 layout of the same model with every matrix replaced
by the dequantized value the served checkpoint stores (``PlannedWeights.emulate`` with target =
source passes the stored bytes through), in fp32. The served engine computes in bf16 on top of the
same weights, so what remains between the two is the engine's arithmetic, not the weights.

``reference_for`` asks the model family the BF16 config.json names (``ModelFamily.served_reference``).
"""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.families.registry import family_for_config
from nvfp4stack.plan.groups import groups_from_checkpoint, load_config_json
from nvfp4stack.schemes import Scheme


def stored_schemes(served_dir: str | Path) -> dict[str, Scheme]:
    """group -> the format the checkpoint stores it in (matrices only)."""
    cfg = load_config_json(Path(served_dir) / "config.json")
    family = family_for_config(cfg)
    return {g.name: s for g, s in groups_from_checkpoint(Path(served_dir), cfg.get("num_hidden_layers"), family)
            if g.is_matrix}


def reference_for(bf16_dir: str | Path, served_dir: str | Path):
    """The fp32 reference of ``served_dir`` for a logprob comparison, by the model family."""
    cfg_path = Path(bf16_dir) / "config.json"
    return family_for_config(load_config_json(cfg_path), str(cfg_path)).served_reference(
        Path(bf16_dir), Path(served_dir))
