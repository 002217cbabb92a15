"""The reference forward of what a server serves: transformers' model with the checkpoint's own weights.

A served checkpoint stores some groups quantized (NVFP4 experts, FP8-block attention, ...). Its
reference is transformers' forward of the BF16 layout of the same model with every matrix replaced
by the dequantized value the served checkpoint stores (``PlannedWeights.emulate`` with target =
source passes the stored bytes through), in fp32. The served engine computes in bf16 on top of the
same weights, so what remains between the two is the engine's arithmetic, not the weights.

``reference_for`` picks by the BF16 config's ``model_type``: DeepSeek-V4 through
``models.reference`` (transformers' ``DeepseekV4ForCausalLM``), the DeepseekV3-architecture tiny
model through ``models.tiny_v3.reference_model`` (its NVFP4 experts, W4A16).
"""
from __future__ import annotations

from pathlib import Path

from nvfp4stack.eval.weights import PlannedWeights
from nvfp4stack.plan.groups import groups_from_checkpoint, load_config_json
from nvfp4stack.schemes import Scheme


def stored_schemes(served_dir: str | Path) -> dict[str, Scheme]:
    """native group -> the format the checkpoint stores it in (matrices only)."""
    cfg = load_config_json(Path(served_dir) / "config.json")
    return {g.name: s for g, s in groups_from_checkpoint(Path(served_dir), cfg.get("num_hidden_layers"))
            if g.is_matrix}


def dsv4_served_reference(bf16_dir: str | Path, served_dir: str | Path):
    """transformers' DeepSeek-V4 (fp32) carrying the weights ``served_dir`` stores."""
    from nvfp4stack.models.reference import apply_emulated_precision, load_reference

    model = load_reference(bf16_dir)
    sources = stored_schemes(served_dir)
    if not sources:
        raise ValueError(f"{served_dir}: no weight matrices found; expected the served DeepSeek-V4 checkpoint")
    weights = PlannedWeights(sources, served_dir)
    applied = apply_emulated_precision(model, lambda g: sources.get(g, Scheme.BF16), weight_fn=weights.emulate)
    missing = sorted(g for g, s in applied.items() if g not in sources)
    if missing:
        raise ValueError(f"{served_dir}: the served checkpoint has no tensor for {missing[:5]} ({len(missing)} "
                         f"in all) that the BF16 model {bf16_dir} has; expected both layouts of one model "
                         "(native DeepSeek names, the same layer count)")
    return model


def reference_for(bf16_dir: str | Path, served_dir: str | Path):
    """The fp32 reference of ``served_dir`` for a logprob comparison, by the model family."""
    model_type = load_config_json(Path(bf16_dir) / "config.json").get("model_type")
    if model_type == "deepseek_v4":
        return dsv4_served_reference(bf16_dir, served_dir)
    if model_type == "deepseek_v3":
        from nvfp4stack.models.tiny_v3 import reference_model

        return reference_model(bf16_dir, served_dir, w4a4=False)
    raise ValueError(f"{bf16_dir}/config.json: model_type {model_type!r} has no reference forward here; "
                     "expected deepseek_v4 or deepseek_v3 (the tiny models)")
