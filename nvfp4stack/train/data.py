"""The corpus as token streams: a seeded by-text train/held-out split, and training windows.

Each text becomes ``<|bos|> text <|eos|>`` (the BOS a chat prompt starts with, the EOS that lets a
reply stop). A ``chat_fraction`` of the training texts is wrapped in the tokenizer's chat template
instead (first line as the user turn, the rest as the assistant's), so the served model's chat
endpoint also answers in corpus words.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from nvfp4stack.corpus import training_texts
from nvfp4stack.train.config import TrainConfig

DATA_VERSION = 1  # bump when the corpus or its formatting changes: it is part of the cache key


@dataclass
class Streams:
    """Token id streams [N] (int64) of the two splits, and how many texts each holds."""

    train: torch.Tensor
    heldout: torch.Tensor
    train_texts: int
    heldout_texts: int


def corpus_digest() -> str:
    """sha256 of the training texts: a Python whose stdlib docs differ trains (and caches) anew."""
    import hashlib

    return hashlib.sha256("\x00".join(training_texts()).encode()).hexdigest()[:16]


def _as_chat(text: str, tokenizer) -> str:
    first, _, rest = text.partition("\n")
    if not rest.strip():
        return tokenizer.bos_token + text + tokenizer.eos_token
    messages = [{"role": "user", "content": first}, {"role": "assistant", "content": rest.strip()}]
    return tokenizer.apply_chat_template(messages, tokenize=False) + tokenizer.eos_token


def split_texts(texts: tuple[str, ...], cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """(train, held-out) texts: a seeded shuffle, the last ``heldout_fraction`` held out."""
    order = list(range(len(texts)))
    random.Random(cfg.seed).shuffle(order)
    n_held = max(1, round(len(texts) * cfg.heldout_fraction))
    return [texts[i] for i in order[:-n_held]], [texts[i] for i in order[-n_held:]]


def corpus_streams(tokenizer, cfg: TrainConfig) -> Streams:
    """Tokenize the corpus once into the train and held-out streams (held-out texts stay plain)."""
    train, held = split_texts(training_texts(), cfg)
    rng = random.Random(cfg.seed + 1)
    wrapped = [_as_chat(t, tokenizer) if rng.random() < cfg.chat_fraction else
               tokenizer.bos_token + t + tokenizer.eos_token for t in train]
    plain_held = [tokenizer.bos_token + t + tokenizer.eos_token for t in held]

    def stream(docs: list[str]) -> torch.Tensor:
        ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
        return torch.tensor([i for doc in ids for i in doc], dtype=torch.int64)

    s = Streams(stream(wrapped), stream(plain_held), len(train), len(held))
    if s.train.numel() <= cfg.seq_len or s.heldout.numel() <= cfg.seq_len:
        raise ValueError(f"train.seq_len={cfg.seq_len}: expected shorter than both splits (train "
                         f"{s.train.numel()}, held-out {s.heldout.numel()} tokens); lower train.seq_len")
    return s


def train_batch(stream: torch.Tensor, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    """[batch_size, seq_len] windows at seeded random offsets of the train stream."""
    starts = torch.randint(0, stream.numel() - cfg.seq_len, (cfg.batch_size,), generator=gen)
    return torch.stack([stream[s:s + cfg.seq_len] for s in starts.tolist()])


def heldout_batches(stream: torch.Tensor, cfg: TrainConfig) -> list[torch.Tensor]:
    """Consecutive, non-overlapping [<= batch_size, seq_len] windows: the first ``eval_tokens`` of
    the held-out stream (the same ones at every evaluation)."""
    n = min(stream.numel() // cfg.seq_len, max(1, cfg.eval_tokens // cfg.seq_len))
    windows = stream[: n * cfg.seq_len].view(n, cfg.seq_len)
    return list(windows.split(cfg.batch_size))
