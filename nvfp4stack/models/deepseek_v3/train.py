"""Train the tiny DeepseekV3 on the stdlib corpus and write it where its factory caches it."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from nvfp4stack.train.cache import MANIFEST, STAMP, announce, finish_manifest, print_summary, train_key
from nvfp4stack.train.config import TrainConfig
from nvfp4stack.train.data import corpus_streams
from nvfp4stack.train.loop import train_loop


def train_tiny_v3(out_dir: str | Path, spec, cfg: TrainConfig) -> Path:
    """Train the tiny DeepseekV3 of ``spec`` from its seeded init; write bf16 weights, tokenizer and
    manifest into ``out_dir`` (atomically; replaces it). The caller's torch RNG state is left as it was."""
    from nvfp4stack.models.deepseek_v3.tiny import init_tiny_v3, patch_config_json, spec_dict
    from nvfp4stack.models.tiny_build import seeded_init, tiny_model_dir

    cfg = cfg.resolved("tiny_v3")
    key = train_key("tiny_v3", spec_dict(spec), cfg)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    announce("tiny_v3", cfg, out)
    t_start = time.perf_counter()
    with tiny_model_dir(out, spec.vocab_size) as (tmp, tok):
        # the seeded init of build_tiny_v3 (the noaux_tc correction bias is a buffer: not trained)
        model = seeded_init(spec.seed, lambda: init_tiny_v3(spec, torch.float32))
        streams = corpus_streams(tok, cfg)
        stats = train_loop(model, streams, cfg, desc="train tiny_v3")
        manifest = finish_manifest(model, streams, cfg, stats, key, t_start)
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        patch_config_json(tmp / "config.json")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (tmp / STAMP).write_text(json.dumps(key, sort_keys=True))
    print_summary("tiny_v3", manifest)
    return out
