"""End to end on the tiny DeepseekV3 (the embedded default): what ``serve`` serves vs its BF16 build.

The tiny DeepseekV3 model quantizes only its routed experts, with modelopt, and ``serve`` caches that export. So here the
reference is transformers' DeepseekV3 forward of the BF16 build (fp32 arithmetic) and the compared
model is the same forward carrying the served export's NVFP4 experts
(``tiny.reference_model``, ``models.hf_experts``): W4A4 fake-quantizes each expert GEMM input with the export's
calibrated ``input_scale``, W4A16 keeps bf16 activations, and a plan with every routed expert BF16
compares the BF16 build with itself (the sanity row: KL 0, top-1 agreement 1).
"""
from __future__ import annotations

import copy
from pathlib import Path

from nvfp4stack.models.hf_experts import ROLE, W4A4, routed_scheme
from nvfp4stack.schemes import Scheme


def tiny_v3_e2e(cfg, batches_for) -> tuple[dict, dict]:
    """(precision summary, e2e metrics) of the recipe's tiny_v3; ``batches_for(tokenizer)`` gives the
    evaluated prompts (the same as every family's harness uses)."""
    import torch
    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    from nvfp4stack.engine.plan_section import engine_plan_for
    from nvfp4stack.eval.e2e import compare_models
    from nvfp4stack.models.deepseek_v3.serve import tiny_v3_checkpoint
    from nvfp4stack.models.deepseek_v3.tiny import TinyV3Spec, ensure_tiny_v3, reference_model

    if cfg.model.factory != "tiny_v3" or cfg.model.path:
        raise ValueError(f"eval.level=e2e for model.family=deepseek_v3: expected model.factory=tiny_v3 (the trained "
                         f"embedded default) and no model.path, found model.factory={cfg.model.factory!r}, "
                         f"model.path={cfg.model.path!r}; use the default recipe")
    spec = TinyV3Spec()
    plan = engine_plan_for(cfg)
    scheme = routed_scheme(plan, "tiny_v3", spec.num_hidden_layers,
                           range(spec.first_k_dense_replace, spec.num_hidden_layers))
    served = Path(tiny_v3_checkpoint(cfg, plan))     # the export serve runs (the BF16 build for bf16 experts)
    bf16 = ensure_tiny_v3(Path(cfg.cache_dir).expanduser() / "tiny_v3", spec)   # cached: what the export came from
    ref = DeepseekV3ForCausalLM.from_pretrained(bf16, dtype=torch.float32).eval()
    if scheme is Scheme.BF16:
        quant = copy.deepcopy(ref)
    else:
        quant = reference_model(bf16, served, w4a4=W4A4[scheme])
    batches = batches_for(AutoTokenizer.from_pretrained(bf16))
    precision = {ROLE: scheme.value, "checkpoint": str(served)}
    return precision, compare_models(ref, quant, batches)


def fidelity(cfg, seed: int) -> dict:
    """``eval.level=e2e`` metrics of the recipe's tiny_v3."""
    from nvfp4stack.eval.prompts import eval_token_ids

    precision, e2e = tiny_v3_e2e(cfg, lambda tok: eval_token_ids(tok, cfg.eval.num_prompts, cfg.eval.max_tokens, seed))
    return {"precision": {k: v for k, v in precision.items() if k != "checkpoint"},
            "checkpoint": precision["checkpoint"], "e2e": e2e}
