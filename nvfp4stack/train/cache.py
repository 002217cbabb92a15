"""The trained-model cache shared by the families' tiny models: cache key, manifest, progress lines.

A family's train function (``ModelFamily.train``) writes every result into a temporary sibling
directory and renames it into place (an interrupted
run leaves nothing half-written; rerunning starts over, which costs at most the few-minute budget),
with ``train_manifest.json``: seed, steps, tokens seen, train and held-out loss and perplexity,
wall time, the spec and the training config.
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from pathlib import Path

import torch

from nvfp4stack.families.registry import train_budget
from nvfp4stack.train.config import TrainConfig
from nvfp4stack.train.data import DATA_VERSION, corpus_digest, heldout_batches
from nvfp4stack.train.loop import heldout_loss

MANIFEST = "train_manifest.json"
STAMP = "nvfp4stack_spec.json"  # the cache key; serve's NVFP4 export is keyed on its text


# Bump when the training loop (optimizer, schedule, windows, scoring) or the tokenizer's chat template
# (models/tokenizer.py, which wraps chat_fraction of the texts) changes; the corpus and its formatting
# have DATA_VERSION (train/data.py). Both are in the cache key: a bump retrains every cached model once.
TRAINER_VERSION = 1


def train_key(model: str, spec: dict, cfg: TrainConfig, **extra) -> dict:
    """What a trained model depends on: the cache stamp (and, hashed, the directory suffix).

    ``extra``: model-specific inputs (e.g. the sha256 of a tokenizer the model starts from)."""
    import tokenizers
    import transformers

    return {"model": model, "spec": spec, "train": cfg.key(), "trainer_version": TRAINER_VERSION,
            "data_version": DATA_VERSION, "corpus_sha256": corpus_digest(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__, **extra}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _round_to_bf16_(model) -> None:
    """Weights as they are saved and served (bf16), kept in fp32 for scoring."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def finish_manifest(model, streams, cfg: TrainConfig, stats: dict, key: dict, t_start: float) -> dict:
    """Score the served (bf16-rounded) weights on the held-out split and assemble the manifest."""
    _round_to_bf16_(model)
    served = heldout_loss(model, heldout_batches(streams.heldout, cfg), cfg)
    vocab = model.config.vocab_size
    return {
        **key, "seed": cfg.seed, **stats,
        "heldout_loss_bf16_weights": served, "heldout_ppl_bf16_weights": math.exp(served),
        "uniform_ppl": vocab, "heldout_ppl_over_uniform": math.exp(served) / vocab,
        "total_wall_s": round(time.perf_counter() - t_start, 2), "host": platform.machine(),
    }


def announce(model: str, cfg: TrainConfig, out: Path) -> None:
    """One line before a run; with the default budget, what that budget took when it was measured
    (the family's ``train_budgets``), so the wait is expected."""
    tokens = cfg.steps * cfg.batch_size * cfg.seq_len
    measured = train_budget(model)[1]
    took = f"; the default budget took {measured}" if measured and cfg == TrainConfig().resolved(model) else ""
    print(f"[train] {model}: training on the stdlib corpus ({cfg.steps} steps, {tokens:,} tokens{took}; "
          f"once, then cached) -> {out}", flush=True)


def print_summary(model: str, m: dict) -> None:
    print(f"[train] {model}: {m['steps']} steps, {m['tokens_seen']:,} tokens in {m['wall_s']:.0f} s "
          f"({m['tokens_per_s']:.0f} tokens/s); train loss {m['final_train_loss']:.3f}, held-out loss "
          f"{m['heldout_loss_bf16_weights']:.3f} = perplexity {m['heldout_ppl_bf16_weights']:.1f} "
          f"(uniform over the vocabulary: {m['uniform_ppl']}, ratio 1/{1 / m['heldout_ppl_over_uniform']:.1f})",
          flush=True)


def read_manifest(model_dir: str | Path) -> dict:
    p = Path(model_dir) / MANIFEST
    if not p.exists():
        raise FileNotFoundError(f"{p}: no training manifest; expected a model written by `python main.py train`")
    return json.loads(p.read_text())


