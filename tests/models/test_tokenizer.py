"""Corpus and tokenizer: deterministic, round-tripping, loadable by transformers with a chat template."""
import random

import pytest

from nvfp4stack.corpus import calibration_texts, corpus_size
from nvfp4stack.models.tokenizer import BOS, EOS, train_tokenizer


def test_calibration_texts_deterministic_and_distinct():
    n = 64
    a, b = calibration_texts(n, seed=3), calibration_texts(n, seed=3)
    assert a == b
    assert len(set(a)) == n, "texts within the pool size must be distinct"
    assert calibration_texts(n, seed=4) != a
    assert corpus_size() > 500
    assert all(len(t) >= 80 for t in a)


def test_calibration_texts_rejects_zero():
    with pytest.raises(ValueError, match="n must be >= 1"):
        calibration_texts(0)


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return train_tokenizer(root / "a", 1024), train_tokenizer(root / "b", 1024)


def test_tokenizer_is_deterministic(tok_dirs):
    a, b = tok_dirs
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert not [p for p in a.parent.iterdir() if p.name.startswith(".")], "temp dir left behind"


def test_tokenizer_round_trip_and_chat_template(tok_dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dirs[0])
    assert len(tok) == 1024
    assert tok.bos_token == BOS and tok.eos_token == EOS
    seed = random.randrange(2**31)
    print(f"seed={seed}")
    rng = random.Random(seed)
    alphabet = "abcXYZ 019_{}()\n\t\u00e9\u00fc\u65e5\u672c\U0001f600"
    for _ in range(20):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60)))
        ids = tok(s)["input_ids"]
        assert all(0 <= i < 1024 for i in ids)
        assert tok.decode(ids) == s
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|bos|><|user|>\nhi<|end|>\n<|assistant|>\n"


def test_tokenizer_rejects_tiny_vocab(tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be >="):
        train_tokenizer(tmp_path / "t", 100)
