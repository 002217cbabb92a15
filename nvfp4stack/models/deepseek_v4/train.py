"""Train the tiny DeepSeek-V4 on the stdlib corpus, in the factory's layouts (cached)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from nvfp4stack.train.cache import (
    MANIFEST,
    STAMP,
    announce,
    file_sha256,
    finish_manifest,
    key_digest,
    print_summary,
    train_key,
)
from nvfp4stack.train.config import TrainConfig
from nvfp4stack.train.data import corpus_streams
from nvfp4stack.train.loop import train_loop


def train_tiny_dsv4(cache_dir: str | Path, cfg: TrainConfig, seed: int = 0) -> Path:
    """The tiny DeepSeek-V4 trained on the stdlib corpus (cached); returns its root. See
    :func:`ensure_trained_tiny_dsv4`."""
    return ensure_trained_tiny_dsv4(cache_dir, cfg, seed)[0]


def ensure_trained_tiny_dsv4(cache_dir: str | Path, cfg: TrainConfig, seed: int = 0) -> tuple[Path, bool]:
    """The tiny DeepSeek-V4 trained on the stdlib corpus, in the factory's three layouts: (its root,
    whether this call trained it; False when the cache had it).

    Starts from the seeded random build (``build_tiny_dsv4``), trains transformers' DeepseekV4 in
    fp32, then stores the result like the random build: BF16 in DeepSeek-native names, routed experts
    rounded onto the MXFP4 grid (as V4's FP4-QAT experts are, so the release cast stays lossless),
    the MTP block left as built (transformers' forward has none to train). The held-out perplexity in
    the manifest is measured on that stored layout (a), reloaded.
    """
    import shutil

    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from nvfp4stack.families.registry import role_of
    from nvfp4stack.io_atomic import atomic_dir
    from nvfp4stack.models.deepseek_v4.layouts import hf_state_to_native
    from nvfp4stack.models.deepseek_v4.reference import load_reference
    from nvfp4stack.models.deepseek_v4.tiny import (
        SPEC_VERSION,
        TINY_DSV4_ARCH,
        build_tiny_dsv4,
        on_mxfp4_grid,
        write_layouts,
    )

    cfg = cfg.resolved("tiny_dsv4")
    cache_dir = Path(cache_dir)
    # training starts from the random root's tokenizer and weights: build (or find) it first, key on both
    random_root = build_tiny_dsv4(cache_dir, seed)
    key = train_key("tiny_dsv4", {"spec_version": SPEC_VERSION, "seed": seed, "arch": TINY_DSV4_ARCH}, cfg,
                    tokenizer_sha256=file_sha256(random_root / "tokenizer" / "tokenizer.json"))
    root = cache_dir / f"tiny_dsv4-v{SPEC_VERSION}-s{seed}-trained-{key_digest(key)}"
    if (root / STAMP).exists() and (root / STAMP).read_text() == json.dumps(key, sort_keys=True):
        return root, False
    announce("tiny_dsv4", cfg, root)
    t_start = time.perf_counter()
    with atomic_dir(root) as tmp:
        tok_dir = random_root / "tokenizer"
        tok = AutoTokenizer.from_pretrained(tok_dir)
        model = load_reference(random_root / "bf16", torch.float32)
        streams = corpus_streams(tok, cfg)
        stats = train_loop(model, streams, cfg, desc="train tiny_dsv4")
        trained = hf_state_to_native({k: v.detach() for k, v in model.state_dict().items()})
        del model
        state = load_file(str(random_root / "bf16" / "model.safetensors"))
        unknown = sorted(set(trained) - set(state))
        if unknown:
            raise KeyError(f"train tiny_dsv4: trained tensors {unknown[:4]} ({len(unknown)} in all) have no "
                           f"counterpart in {random_root}/bf16; expected layout-(a) names (checkpoint.layouts)")
        for name, t in trained.items():
            if state[name].is_floating_point():
                t = t.to(state[name].dtype)
                state[name] = on_mxfp4_grid(t, name) if role_of(name, "deepseek_v4") == "routed_experts" else t
        config = json.loads((random_root / "bf16" / "config.json").read_text())
        write_layouts(tmp, state, config, tok_dir)
        shutil.copytree(tok_dir, tmp / "tokenizer")
        stored = load_reference(tmp / "bf16", torch.float32)
        manifest = finish_manifest(stored, streams, cfg, stats, key, t_start)
        manifest["stored_as"] = "bf16, routed experts on the MXFP4 grid, MTP as built"
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (tmp / STAMP).write_text(json.dumps(key, sort_keys=True))
    print_summary("tiny_dsv4", manifest)
    return root, True
