"""Reference forwards of the tiny Qwen3-MoE: transformers' ``Qwen3MoeForCausalLM`` in fp32, with the
routed experts of an NVFP4 export, and the ``eval`` fidelity table of what ``serve`` serves.

Only the routed experts are quantized on this family (modelopt ``NVFP4_EXPERTS_ONLY_CFG``), so the
reference is the BF16 build in fp32 and the compared model is the same forward carrying the served
export's experts, dequantized with ``formats.nvfp4``: W4A4 fake-quantizes each expert GEMM input
with the export's calibrated ``input_scale``, W4A16 keeps the activations.
"""
from __future__ import annotations

import copy
from pathlib import Path

from nvfp4stack.models.hf_experts import ROLE, W4A4, routed_scheme, with_nvfp4_experts
from nvfp4stack.schemes import Scheme


def reference_model(bf16_dir: str | Path, nvfp4_dir: str | Path, *, w4a4: bool, dtype=None):
    """transformers' Qwen3-MoE forward of ``bf16_dir`` with the routed experts stored in ``nvfp4_dir``
    (``models.hf_experts``)."""
    import torch
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM.from_pretrained(bf16_dir, dtype=dtype or torch.float32).eval()
    return with_nvfp4_experts(model, nvfp4_dir, w4a4=w4a4)


def fidelity_e2e(cfg, seed: int) -> dict:
    """The ``eval`` metrics of the recipe's tiny Qwen3-MoE: its served export against its BF16 build."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeForCausalLM

    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.eval.e2e import compare_models
    from nvfp4stack.eval.prompts import eval_token_ids
    from nvfp4stack.models.qwen3_moe.pipeline import FACTORY, build_factory, serve_checkpoint

    if cfg.model.path or cfg.model.factory != FACTORY or cfg.quantize.source:
        raise ValueError(f"eval.level=e2e for model.family=qwen3_moe: expected the tiny factory model (model.factory="
                         f"{FACTORY}, no model.path, no quantize.source: the build serve quantizes), found model.factory="
                         f"{cfg.model.factory!r}, model.path={cfg.model.path!r}, quantize.source={cfg.quantize.source!r};"
                         " use recipe=tiny_qwen3_moe")
    plan = engine_plan_for(cfg)
    bf16 = build_factory(Path(cfg.cache_dir).expanduser(), "bf16")   # what serve_checkpoint quantizes
    layers = int(Qwen3MoeForCausalLM.config_class.from_pretrained(bf16).num_hidden_layers)
    scheme = routed_scheme(plan, "qwen3_moe", layers, range(layers))
    served = Path(serve_checkpoint(cfg, plan))        # the export serve runs (the BF16 build for bf16 experts)
    ref = Qwen3MoeForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    quant = copy.deepcopy(ref) if scheme is Scheme.BF16 else reference_model(bf16, served, w4a4=W4A4[scheme])
    batches = eval_token_ids(AutoTokenizer.from_pretrained(bf16), cfg.eval.num_prompts, cfg.eval.max_tokens, seed)
    return {"precision": {ROLE: scheme.value}, "checkpoint": str(served), "e2e": compare_models(ref, quant, batches)}
