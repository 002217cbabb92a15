"""A small byte-level BPE tokenizer trained locally on the stdlib corpus, saved for transformers.

Byte-level BPE means every string round-trips (no unknown tokens), which the OpenAI server
needs for arbitrary prompts. Training is single-threaded so the merges, and hence the saved
files, are identical from run to run.
"""
from __future__ import annotations

import os
from pathlib import Path

from nvfp4stack.corpus import calibration_texts, corpus_size
from nvfp4stack.io_atomic import atomic_dir

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (PAD, BOS, EOS) + ROLE_TOKENS

# Each turn is "<|role|>\n content <|end|>\n"; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet plus the specials


def train_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 2048) -> Path:
    """Train the BPE tokenizer and save it (tokenizer.json + tokenizer_config.json) in ``out_dir``.

    Written to a temporary sibling directory, then renamed, so a crash never leaves a half
    tokenizer. An existing ``out_dir`` is replaced.
    """
    if vocab_size < _MIN_VOCAB:
        raise ValueError(
            f"train_tokenizer: vocab_size must be >= {_MIN_VOCAB} (256 bytes + "
            f"{len(SPECIAL_TOKENS)} special tokens), got {vocab_size}; raise it"
        )
    # The env var must be set before the Rust pool starts: one thread -> deterministic merges.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(calibration_texts(corpus_size(), seed=0), trainer=trainer)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out) as tmp:
        hf_tok.save_pretrained(tmp)
    return out
