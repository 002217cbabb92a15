"""The evaluated prompts: bundled texts, tokenized and cut, the same for every family's fidelity harness."""
from __future__ import annotations

import torch


def eval_token_ids(tokenizer, num_prompts: int, max_tokens: int, seed: int) -> list[torch.Tensor]:
    """``num_prompts`` bundled texts (stdlib docstrings, seeded order), each cut to ``max_tokens`` tokens."""
    from nvfp4stack.corpus import calibration_texts

    if max_tokens < 2:
        raise ValueError(f"eval.max_tokens={max_tokens}: expected >= 2 (next-token metrics need two tokens); "
                         "set eval.max_tokens=64")
    out = []
    for text in calibration_texts(num_prompts, seed):
        ids = tokenizer(text, return_tensors="pt").input_ids[:, :max_tokens]
        if ids.shape[1] >= 2:
            out.append(ids)
    if not out:
        raise ValueError(f"eval: no prompt of >= 2 tokens among {num_prompts} texts; raise eval.num_prompts")
    return out
