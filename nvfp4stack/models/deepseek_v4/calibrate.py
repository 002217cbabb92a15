"""modelopt PTQ calibration of a BF16 DeepSeek-V4 (transformers) on the bundled corpus, on CPU.

Reuses the generic driver (nvfp4stack.quantize.modelopt_ptq: ``calibrate`` with modelopt's
NVFP4_EXPERTS_ONLY_CFG, ``snapshot_amax``). modelopt wraps transformers' fused DeepseekV4Experts
with its _QuantFusedExperts (per-expert weight quantizers, one input quantizer per projection).
Only amax is taken from here; the export is nvfp4stack.models.deepseek_v4.export.
"""
from __future__ import annotations

from pathlib import Path

import torch

from nvfp4stack.corpus import calibration_texts
from nvfp4stack.models.deepseek_v4.calib_state import native_amax_from_snapshot

QUANT_CFG = "NVFP4_EXPERTS_ONLY_CFG"  # routed experts W4A4 NVFP4; shared experts, gate, attention off


def calibration_rows(tokenizer, samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """Corpus texts tokenized, joined with EOS, cut into [rows, seq_len] (no padding to mask)."""
    ids: list[int] = []
    for text in calibration_texts(samples, seed=seed):
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    rows = len(ids) // seq_len
    if rows < 1:
        raise ValueError(f"quantize.calib_seq_len={seq_len}: the {samples} calibration texts give only "
                         f"{len(ids)} tokens; raise quantize.calib_samples or lower calib_seq_len")
    return torch.tensor(ids[: rows * seq_len], dtype=torch.long).view(rows, seq_len)


def calibrate_dsv4(source_dir: str | Path, *, samples: int, seq_len: int, batch_size: int,
                   seed: int, dtype: torch.dtype = torch.float32, keep_model: bool = False):
    """Calibrate; return (native amax dict on CPU, stats), plus the calibrated model if keep_model."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from nvfp4stack.models.deepseek_v4.reference import load_reference
    from nvfp4stack.quantize.modelopt_ptq import calibrate, snapshot_amax

    tokenizer = AutoTokenizer.from_pretrained(source_dir)
    # The weights are BF16 values either way; fp32 compute is ~10x faster than bf16 on CPUs without
    # AVX512-BF16, and only amax leaves this function (the export quantizes the stored BF16 weights).
    model = load_reference(source_dir, dtype=dtype)
    rows = calibration_rows(tokenizer, samples, seq_len, seed)

    def forward_loop(m):
        with torch.no_grad():
            for batch in tqdm(rows.split(batch_size), desc="calibrate", unit="batch"):
                m(input_ids=batch)

    calibrate(model, tokenizer, QUANT_CFG, forward_loop=forward_loop)
    snapshot = snapshot_amax(model)  # CPU copies, taken before anything else can go wrong
    amax = native_amax_from_snapshot(snapshot, model.config.n_routed_experts)
    n_weight = sum(k.endswith("_weight_quantizer._amax") for k in amax)
    stats = {"rows": int(rows.shape[0]), "tokens": int(rows.numel()), "seq_len": seq_len,
             "samples": samples, "seed": seed, "dtype": str(dtype), "quant_cfg": QUANT_CFG, "n_amax": len(amax),
             "n_weight_amax": n_weight, "n_input_amax": len(amax) - n_weight}
    if keep_model:
        return amax, stats, model
    return amax, stats
