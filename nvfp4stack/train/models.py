"""Train the tiny models (tiny_v3, tiny_dsv4) and write them where their factories cache them.

Every result is written into a temporary sibling directory and renamed into place (an interrupted
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

from nvfp4stack.train.config import TrainConfig
from nvfp4stack.train.data import DATA_VERSION, corpus_digest, corpus_streams, heldout_batches
from nvfp4stack.train.loop import heldout_loss, train_loop

MANIFEST = "train_manifest.json"
STAMP = "nvfp4stack_spec.json"  # the cache key; serve's NVFP4 export is keyed on its text


# Bump when the training loop (optimizer, schedule, windows, scoring) or the tokenizer's chat template
# (models/tokenizer.py, which wraps chat_fraction of the texts) changes; the corpus and its formatting
# have DATA_VERSION (train/data.py). Both are in the cache key: a bump retrains every cached model once.
TRAINER_VERSION = 1


def train_key(model: str, spec: dict, cfg: TrainConfig, **extra) -> dict:
    """What a trained model depends on: the cache stamp (and, hashed, the directory suffix).

    ``extra``: model-specific inputs (tiny_dsv4: the sha256 of the random root's tokenizer.json)."""
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


def _finish(model, streams, cfg: TrainConfig, stats: dict, key: dict, t_start: float) -> dict:
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


# What the default budget of each model took (README, "Train the tiny models"); printed before a run
# of that budget so the wait is expected. Other budgets get no estimate.
MEASURED = {"tiny_v3": "158 s on 2 free cores, much longer when they are shared",
            "tiny_dsv4": "329 s on 2 shared cores"}


def announce(model: str, cfg: TrainConfig, out: Path) -> None:
    tokens = cfg.steps * cfg.batch_size * cfg.seq_len
    took = (f"; the default budget took {MEASURED[model]}"
            if model in MEASURED and cfg == TrainConfig().resolved(model) else "")
    print(f"[train] {model}: training on the stdlib corpus ({cfg.steps} steps, {tokens:,} tokens{took}; "
          f"once, then cached) -> {out}", flush=True)


def train_tiny_v3(out_dir: str | Path, spec, cfg: TrainConfig) -> Path:
    """Train the tiny DeepseekV3 of ``spec`` from its seeded init; write bf16 weights, tokenizer and
    manifest into ``out_dir`` (atomically; replaces it). The caller's torch RNG state is left as it was."""
    import shutil

    from transformers import AutoTokenizer, DeepseekV3ForCausalLM

    from nvfp4stack.io_atomic import atomic_dir
    from nvfp4stack.models.tiny_v3 import hf_config, patch_config_json, spec_dict
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
        manifest = _finish(model, streams, cfg, stats, key, t_start)
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        shutil.rmtree(tmp / "tok")
        patch_config_json(tmp / "config.json")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (tmp / STAMP).write_text(json.dumps(key, sort_keys=True))
    print_summary("tiny_v3", manifest)
    return out


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

    from nvfp4stack.checkpoint.layouts import hf_state_to_native
    from nvfp4stack.io_atomic import atomic_dir
    from nvfp4stack.models.reference import load_reference
    from nvfp4stack.models.tiny_dsv4 import (
        SPEC_VERSION, TINY_DSV4_ARCH, build_tiny_dsv4, on_mxfp4_grid, write_layouts)
    from nvfp4stack.plan.roles import role_of

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
                state[name] = on_mxfp4_grid(t, name) if role_of(name) == "routed_experts" else t
        config = json.loads((random_root / "bf16" / "config.json").read_text())
        write_layouts(tmp, state, config, tok_dir)
        shutil.copytree(tok_dir, tmp / "tokenizer")
        stored = load_reference(tmp / "bf16", torch.float32)
        manifest = _finish(stored, streams, cfg, stats, key, t_start)
        manifest["stored_as"] = "bf16, routed experts on the MXFP4 grid, MTP as built"
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        (tmp / STAMP).write_text(json.dumps(key, sort_keys=True))
    print_summary("tiny_dsv4", manifest)
    return root, True
