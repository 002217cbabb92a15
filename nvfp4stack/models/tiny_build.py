"""What every family's tiny-model builder does around its own model class: the spec's checks, a fresh
tokenizer with the special ids the tiny configs state, a seeded init that leaves the caller's RNG
alone, the atomic save of both into the model directory, and the cache stamp that skips a rebuild."""
from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from nvfp4stack.io_atomic import atomic_dir
from nvfp4stack.models.tokenizer import BOS, EOS, PAD, train_tokenizer


@contextmanager
def tiny_model_dir(out_dir: str | os.PathLike, vocab_size: int) -> Iterator[tuple[Path, object]]:
    """``(tmp, tokenizer)``: a temporary directory that becomes ``out_dir`` atomically (replacing it)
    when the body ends, holding the freshly trained tokenizer, which is saved there on the way out.
    The body saves the model into ``tmp``."""
    from transformers import AutoTokenizer

    with atomic_dir(Path(out_dir)) as tmp:
        train_tokenizer(tmp / "tok", vocab_size)
        tok = AutoTokenizer.from_pretrained(tmp / "tok")
        specials, ids = (tok.pad_token, tok.bos_token, tok.eos_token), tok.convert_tokens_to_ids([PAD, BOS, EOS])
        if specials != (PAD, BOS, EOS) or ids != [0, 1, 2]:
            raise ValueError(f"tokenizer: expected pad/bos/eos {PAD}, {BOS}, {EOS} at ids 0, 1, 2 (the config's), "
                             f"found {specials} at {ids}; fix models/tokenizer.py")
        yield tmp, tok
        tok.save_pretrained(tmp)
        shutil.rmtree(tmp / "tok")


def seeded_init(seed: int, make: Callable):
    """``make()`` under ``torch.manual_seed(seed)``, without reseeding the caller's RNG."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def check_spec(spec_name: str, checks: list[tuple[bool, str, str, object]]) -> None:
    """Raise on the first failed ``(ok, field, expected, found)`` of a tiny spec, naming the field."""
    for ok, key, expected, found in checks:
        if not ok:
            raise ValueError(f"{spec_name}.{key}: expected {expected}, found {found}; change it")


def ensure_built(out: Path, stamp_dict: dict, build: Callable[[Path], Path]) -> Path:
    """``out``, built by ``build(out)`` unless its stamp (``STAMP``) already records ``stamp_dict``."""
    from nvfp4stack.train.cache import STAMP

    want = json.dumps(stamp_dict, sort_keys=True)
    stamp = out / STAMP
    if not (stamp.exists() and stamp.read_text() == want):
        build(out)
        stamp.write_text(want)
    return out
