"""Train the tiny DeepseekV3 on the stdlib corpus and write it where its factory caches it."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from nvfp4stack.train.cache import (MANIFEST, STAMP, announce, finish_manifest, print_summary, train_key)
from nvfp4stack.train.config import TrainConfig
from nvfp4stack.train.data import corpus_streams
from nvfp4stack.train.loop import train_loop



def train_tiny_v3(out_dir: str | Path, spec, cfg: TrainConfig) -> Path:
    """Train the tiny DeepseekV3 of ``spec`` from its seeded init; write bf16 weights, tokenizer and
    manifest into ``out_dir`` (atomically; replaces it). The caller's torch RNG state is left as it was."""
    import shutil

    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    from nvfp4stack.io_atomic import atomic_dir
    from nvfp4stack.models.deepseek_v3.tiny import hf_config, patch_config_json, spec_dict
    from nvfp4stack.models.tokenizer import train_tokenizer

    cfg = cfg.resolved("tiny_v3")
    key = train_key("tiny_v3", spec_dict(spec), cfg)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    announce("tiny_v3", cfg, out)
    t_start = time.perf_counter()
    with atomic_dir(out) as tmp:
        train_tokenizer(tmp / "tok", spec.vocab_size)
        tok = AutoTokenizer.from_pretrained(tmp / "tok")
        with torch.random.fork_rng(devices=[]):  # the seeded init, without reseeding the caller's RNG
            torch.manual_seed(spec.seed)
            model = DeepseekV3ForCausalLM(hf_config(spec)).float()
            with torch.no_grad():  # as build_tiny_v3: a random noaux_tc correction bias (a buffer, not trained)
                for layer in model.model.layers[spec.first_k_dense_replace:]:
                    layer.mlp.gate.e_score_correction_bias.uniform_(-0.05, 0.05)
        streams = corpus_streams(tok, cfg)
        stats = train_loop(model, streams, cfg, desc="train tiny_v3")
        manifest = finish_manifest(model, streams, cfg, stats, key, t_start)
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        shutil.rmtree(tmp / "tok")
        patch_config_json(tmp / "config.json")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (tmp / STAMP).write_text(json.dumps(key, sort_keys=True))
    print_summary("tiny_v3", manifest)
    return out
