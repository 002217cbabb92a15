"""DeepSeek-V4 fidelity (``eval.level`` layertest / e2e): transformers' forward of the BF16 weights
against the same forward with every planned role emulated (nvfp4stack.formats)."""
from __future__ import annotations

import copy

import torch

from nvfp4stack.eval.e2e import compare_models
from nvfp4stack.eval.precision import EvalPrecision
from nvfp4stack.models.deepseek_v4.reference import apply_emulated_precision


@torch.no_grad()
def end_to_end(ref_model, prec: EvalPrecision, batches: list[torch.Tensor], input_amax: dict[str, float]) -> dict:
    """The reference and its emulated copy; NVFP4 (W4A4) inputs use static scales from
    ``input_amax``."""
    q_model = copy.deepcopy(ref_model)
    apply_emulated_precision(q_model, prec.scheme_for, act_fake_quant=True, input_amax=input_amax,
                             weight_fn=prec.weights.emulate)
    return compare_models(ref_model, q_model, batches)


def fidelity(cfg, seed: int) -> dict:
    """The metrics of ``eval.level`` (layertest or e2e) for the recipe's DeepSeek-V4."""
    from transformers import AutoTokenizer

    from nvfp4stack.eval.precision import bf16_checkpoint_dir, eval_precision
    from nvfp4stack.eval.prompts import eval_token_ids
    from nvfp4stack.models.deepseek_v4.capture import activation_amax, capture
    from nvfp4stack.models.deepseek_v4.layertest import layertest
    from nvfp4stack.models.deepseek_v4.reference import load_reference

    torch.manual_seed(seed)
    ckpt = bf16_checkpoint_dir(cfg)
    prec = eval_precision(cfg, ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = load_reference(ckpt, torch.float32)  # BF16 weights, fp32 arithmetic: the reference
    batches = eval_token_ids(tok, cfg.eval.num_prompts, cfg.eval.max_tokens, seed)
    out = {"precision": prec.role_schemes(), "weight_bytes": prec.weight_bytes, "plan_gpu_bytes": prec.plan_gpu_bytes,
           "served": prec.served, "plan_error": prec.plan_error, "checkpoint": str(ckpt)}
    if cfg.eval.level == "layertest":
        caps = capture(model, batches)
        out["layertest"] = layertest(model, caps, prec, cfg.backend.moe)
    else:
        # static W4A4 input scales calibrated on other texts than the evaluated ones
        calib = eval_token_ids(tok, cfg.eval.num_prompts, cfg.eval.max_tokens, seed + 1)
        amax = activation_amax(model, capture(model, calib, desc="calibration"))
        out["e2e"] = end_to_end(model, prec, batches, amax)
    return out
