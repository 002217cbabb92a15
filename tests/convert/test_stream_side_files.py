"""convert copies only allow-listed side files (configs, tokenizer, license, read-me), as regular
files, never through a link leaving the checkpoint, and never a pickle or code (issue #36)."""
import json
import logging
from pathlib import Path

import pytest

from nvfp4stack.checkpoint.side_files import is_side_file
from nvfp4stack.cli import EXIT_USAGE, run_task
from nvfp4stack.convert.stream import MANIFEST, convert_checkpoint
from tests.convert.test_stream import make_checkpoint

RULES = {"*.ffn.experts.*.w2": "bf16_to_nvfp4", "*": "passthrough"}
SIDE = {"LICENSE": "Apache-2.0\n", "README.md": "# tiny\n", "generation_config.json": '{"do_sample": false}\n',
        "chat_template.jinja": "{{ messages }}\n"}
NEVER = {"weights.pt": b"\x80\x04K\x01.", "extra.bin": b"\x80\x04N.", "modeling_tiny.py": b"import os\n",
         "LICENSE.py": b"print(1)\n", "optimizer.pkl": b"\x80\x04N.", "notes_here.txt": b"notes\n"}


@pytest.fixture
def src(tmp_path, seed) -> Path:
    d = tmp_path / "src"
    make_checkpoint(d, seed, layers=1, experts=2, hidden=64, inter=32, shard_bytes=20_000)
    for name, text in SIDE.items():
        (d / name).write_text(text)
    for name, raw in NEVER.items():
        (d / name).write_bytes(raw)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("not the checkpoint's\n")
    (d / "notes.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    return d


def test_only_allow_listed_regular_files_are_copied(src, tmp_path, caplog):
    dst = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        convert_checkpoint(src, dst, RULES, progress=False)
    copied = sorted(p.name for p in dst.iterdir() if not p.name.endswith(".safetensors"))
    assert copied == sorted(["LICENSE", "README.md", "chat_template.jinja", "config.json", "convert_report.json",
                             "generation_config.json", MANIFEST, "model.safetensors.index.json", "tokenizer.json"])
    assert not any(p.is_symlink() for p in dst.iterdir())
    for name, text in SIDE.items():
        assert (dst / name).read_text() == text
    assert "not the checkpoint's" not in "".join(p.read_text(errors="replace") for p in dst.iterdir()
                                                 if not p.name.endswith(".safetensors"))
    warning = [r.getMessage() for r in caplog.records if "not copied into the output" in r.getMessage()]
    assert len(warning) == 1 and all(n in warning[0] for n in [*NEVER, "notes.txt"])
    assert set(json.loads((dst / MANIFEST).read_text())) == {p.name for p in dst.iterdir()} - {MANIFEST}


def test_allow_listed_file_linking_outside_is_refused(src, tmp_path, capsys):
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").symlink_to(tmp_path / "outside" / "secret.txt")
    dst = tmp_path / "out"
    code = run_task(lambda: convert_checkpoint(src, dst, RULES, progress=False), "convert", tmp_path / "cli.log")
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == EXIT_USAGE == 2 and len(err) == 1
    assert err[0].startswith(f"nvfp4stack convert: error: side file tokenizer.json: {src / 'tokenizer.json'} "
                             f"links to {(tmp_path / 'outside' / 'secret.txt').resolve()}, outside the checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.log", "outside", "src"]  # no dst, no temp dir


def test_link_inside_the_checkpoint_lands_as_a_regular_file(src, tmp_path):
    (src / "tok.blob").write_text('{"model": {}}\n')
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.json").symlink_to("tok.blob")
    convert_checkpoint(src, tmp_path / "out", RULES, progress=False)
    out = tmp_path / "out" / "tokenizer.json"
    assert not out.is_symlink() and out.read_text() == '{"model": {}}\n'
    assert not (tmp_path / "out" / "tok.blob").exists()


@pytest.mark.parametrize("name,ok", [
    ("tokenizer.json", True), ("tokenizer.model", True), ("LICENSE.txt", True), ("qwen.tiktoken", True),
    ("vocab.json", True), ("merges.txt", True), ("model.pt", False), ("pytorch_model.bin", False),
    ("LICENSE.py", False), ("README.sh", False), ("training_args.bin", False), ("notes.txt", False),
    (".gitattributes", False), ("convert_report.json", False)])
def test_allow_list(name, ok):
    assert is_side_file(name) is ok
