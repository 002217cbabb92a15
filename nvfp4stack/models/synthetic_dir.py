"""The weight-free model directory ``--model`` points at under ``engine.load_format=synthetic``.

It holds the model's config.json (``model.num_layers`` applied) and a tokenizer, nothing else: the
weights are drawn at load by the plugin's loader (``engine/synthetic_loader.py``). Built once per
config under ``<cache_dir>/synthetic/`` (a temporary sibling, then one rename). The tokenizer is the
source directory's own where it has one, else the stdlib BPE tokenizer of the tiny models (a
descriptor has none): a few thousand ids inside the model's vocabulary, enough to drive the engine.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from nvfp4stack.families.resolve import cache_root, config_json_path, with_num_layers
from nvfp4stack.io_atomic import atomic_dir
from nvfp4stack.plan.groups import load_config_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "chat_template.jinja")
TOKENIZER_VOCAB = 2048


def synthetic_model_dir(model, cache_dir: str) -> Path:
    """config.json + tokenizer of ``model`` (a ModelConfig) for the synthetic load format."""
    src = config_json_path(model, cache_dir)
    hf = with_num_layers(load_config_json(src), model.num_layers)
    digest = hashlib.sha256(json.dumps(hf, sort_keys=True).encode()).hexdigest()[:12]
    out = cache_root(cache_dir) / "synthetic" / f"{model.name}-L{hf['num_hidden_layers']}-{digest}"
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        tok = [src.parent / f for f in TOKENIZER_FILES if (src.parent / f).is_file()]
        if tok:
            for f in tok:
                shutil.copyfile(f, tmp / f.name)
        else:
            from nvfp4stack.models.tokenizer import train_tokenizer

            for f in train_tokenizer(tmp / ".tokenizer", TOKENIZER_VOCAB).iterdir():
                shutil.move(str(f), tmp / f.name)
            shutil.rmtree(tmp / ".tokenizer")
            from transformers import AutoTokenizer

            t = AutoTokenizer.from_pretrained(tmp)
            hf = {**hf, "bos_token_id": t.bos_token_id, "eos_token_id": t.eos_token_id}
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    return out
