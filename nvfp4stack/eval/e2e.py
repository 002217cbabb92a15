"""End to end: next-token KL, top-1 agreement and perplexity of a quantized model vs its reference."""
from __future__ import annotations

import math

import torch
from tqdm import tqdm

from nvfp4stack.eval.metrics import next_token_stats


@torch.no_grad()
def compare_models(ref_model, q_model, batches: list[torch.Tensor]) -> dict:
    """Both models on the same prompts: KL(ref || q) per next-token position, top-1 agreement, and
    each model's perplexity on the prompts' own next tokens."""
    acc: dict[str, float] = {}
    for ids in tqdm(batches, desc="e2e", leave=False):
        ref = ref_model(input_ids=ids, use_cache=False).logits[0, :-1]      # [T-1, V]
        q = q_model(input_ids=ids, use_cache=False).logits[0, :-1]
        s = next_token_stats(ref, q, ids[0, 1:])
        for k, v in s.items():
            acc[k] = max(acc.get(k, v), v) if k == "kl_max" else acc.get(k, 0) + v
    n = acc["positions"]
    return {"positions": int(n), "prompts": len(batches),
            "kl_mean": acc["kl_sum"] / n, "kl_max": acc["kl_max"], "top1_agreement": acc["top1_sum"] / n,
            "ppl_ref": math.exp(acc["nll_ref_sum"] / n), "ppl_quant": math.exp(acc["nll_q_sum"] / n)}
