"""A checkpoint's index can name only files inside the checkpoint directory (issue #36): absolute
paths, '..', sub-directories and links leaving the directory are refused by the reader every
command uses, and `convert` exits 2 leaving nothing behind."""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from nvfp4stack.checkpoint.safetensors_io import INDEX_NAME, ShardedReader, save_sharded
from nvfp4stack.cli import EXIT_USAGE, run_task
from nvfp4stack.convert.stream import convert_checkpoint

RULES = {"*": "passthrough"}


def _tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.attn.wq_a.weight": torch.randn(32, 48, generator=g).bfloat16() for i in range(4)}


@pytest.fixture
def ckpt(tmp_path, seed) -> Path:
    """A 2+-shard checkpoint in tmp_path/src, and a copy of its last shard outside it, in tmp_path/elsewhere."""
    src = tmp_path / "src"
    save_sharded(_tensors(seed), src, max_shard_bytes=6_000)
    shards = sorted(src.glob("model-*.safetensors"))
    assert len(shards) >= 2
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(shards[-1], tmp_path / "elsewhere" / "x.safetensors")
    return src


def _point_index(src: Path, to: str) -> str:
    """Make the index send the last shard's tensors to ``to``; returns one of those tensors."""
    idx = json.loads((src / INDEX_NAME).read_text())
    last = sorted(set(idx["weight_map"].values()))[-1]
    moved = sorted(k for k, v in idx["weight_map"].items() if v == last)
    idx["weight_map"].update({k: to for k in moved})
    (src / INDEX_NAME).write_text(json.dumps(idx))
    (src / last).unlink()
    return moved[0]


def _convert_exit(src, dst, tmp_path, capsys):
    code = run_task(lambda: convert_checkpoint(src, dst, RULES, progress=False), "convert", tmp_path / "cli.log")
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return code, err[0]


@pytest.mark.parametrize("entry", ["ABS", "../elsewhere/x.safetensors", "../../x.safetensors",
                                   "sub/x.safetensors", ".."])
def test_index_entry_outside_the_directory_is_refused(ckpt, tmp_path, capsys, entry):
    if entry == "ABS":
        entry = str(tmp_path / "elsewhere" / "x.safetensors")
    tensor = _point_index(ckpt, entry)
    with pytest.raises(ValueError) as e:
        ShardedReader(ckpt)
    assert str(e.value).startswith(f"{INDEX_NAME} weight_map[{tensor!r}]: shard {entry!r} is not a plain file name")
    dst = tmp_path / "out"
    code, line = _convert_exit(ckpt, dst, tmp_path, capsys)
    assert code == EXIT_USAGE == 2
    assert line.startswith(f"nvfp4stack convert: error: {INDEX_NAME} weight_map[{tensor!r}]: shard {entry!r}")
    assert "put that file in the directory" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.log", "elsewhere", "src"]  # no dst, no temp dir


def test_shard_linking_outside_is_refused(ckpt, tmp_path, capsys):
    shard = sorted(ckpt.glob("model-*.safetensors"))[-1]
    shard.unlink()
    shard.symlink_to(tmp_path / "elsewhere" / "x.safetensors")
    tensor = sorted(k for k, v in json.loads((ckpt / INDEX_NAME).read_text())["weight_map"].items()
                    if v == shard.name)[0]
    dst = tmp_path / "out"
    code, line = _convert_exit(ckpt, dst, tmp_path, capsys)
    assert code == 2
    assert line.startswith(f"nvfp4stack convert: error: {INDEX_NAME} weight_map[{tensor!r}]: {shard} links to "
                           f"{(tmp_path / 'elsewhere' / 'x.safetensors').resolve()}, outside the checkpoint")
    assert "cp --dereference" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.log", "elsewhere", "src"]


def test_index_itself_linking_outside_is_refused(ckpt, tmp_path):
    real = tmp_path / "elsewhere" / INDEX_NAME
    os.replace(ckpt / INDEX_NAME, real)
    (ckpt / INDEX_NAME).symlink_to(real)
    with pytest.raises(ValueError, match=f"^{INDEX_NAME}: .* links to .*outside the checkpoint directory"):
        ShardedReader(ckpt)


def test_links_that_stay_inside_are_read(ckpt, tmp_path, seed):
    """A shard linking to a file inside the directory, and a Hugging Face hub snapshot (its files
    link into the repo's blobs/), read as before."""
    shard = sorted(ckpt.glob("model-*.safetensors"))[0]
    os.replace(shard, ckpt / "blob")
    shard.symlink_to("blob")
    assert set(ShardedReader(ckpt).names()) == set(_tensors(seed))
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    for p in ckpt.iterdir():
        if p.is_file() and not p.is_symlink():
            shutil.copy(p, repo / "blobs" / p.name)
            (snap / p.name).symlink_to(os.path.relpath(repo / "blobs" / p.name, snap))
    (snap / shard.name).symlink_to(os.path.relpath(repo / "blobs" / "blob", snap))
    r = ShardedReader(snap)
    assert set(r.names()) == set(_tensors(seed))
    assert torch.equal(r.get("layers.0.attn.wq_a.weight"), _tensors(seed)["layers.0.attn.wq_a.weight"])


def test_doctor_and_planner_read_no_header_through_a_link_out(ckpt, tmp_path):
    """A stray *.safetensors beside the shards that links out of the checkpoint: the doctor reports it
    (check 'path') without reading it, and the planner's header scan refuses it."""
    from nvfp4stack.doctor.files import read_checkpoint
    from nvfp4stack.doctor.report import DoctorReport
    from nvfp4stack.plan.groups import checkpoint_tensors

    os.symlink(tmp_path / "elsewhere" / "x.safetensors", ckpt / "stray.safetensors")
    report = DoctorReport(str(ckpt))
    tensors = read_checkpoint(ckpt, report)
    bad = [f for f in report.errors if f.check == "path"]
    assert [f.where for f in bad] == ["stray.safetensors"] and "outside the checkpoint directory" in bad[0].fix
    assert all(info.file.name != "stray.safetensors" for info in tensors.values())
    with pytest.raises(ValueError, match=r"stray.safetensors: .*links to .*outside the checkpoint directory"):
        checkpoint_tensors(ckpt)
