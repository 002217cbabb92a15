"""convert keeps completed work and trusts only what it checks (issue #36): 'already complete'
verifies the shards, a kill during finalize keeps every shard, free space is checked before the
first shard, a full disk is one line with the temp output removed; exit codes per the contract."""
import errno
import json
import shutil
from collections import namedtuple

import pytest

from nvfp4stack.cli import EXIT_USAGE, run_task
from nvfp4stack.convert import finalize, shard_writer
from nvfp4stack.convert.stream import convert_checkpoint
from tests.convert.test_stream import make_checkpoint, tree_bytes

RULES = {"*.ffn.experts.*.w2": "bf16_to_nvfp4", "*.attn.w*": "bf16_to_fp8_block", "*": "passthrough"}
SHARD = 60_000


@pytest.fixture
def src(tmp_path, seed):
    d = tmp_path / "src"
    make_checkpoint(d, seed, layers=2, experts=2, hidden=128, inter=64, shard_bytes=100_000)
    return d


@pytest.fixture
def ref(src, tmp_path):
    out = tmp_path / "ref"
    convert_checkpoint(src, out, RULES, max_shard_bytes=SHARD, progress=False)
    assert json.loads((out / "convert_report.json").read_text())["shards"] >= 3
    return out


def _run(src, dst, tmp_path, capsys, **kw):
    """(exit code, stdout, stderr lines) of convert under the CLI's exit-code contract."""
    code = run_task(lambda: convert_checkpoint(src, dst, RULES, max_shard_bytes=SHARD, progress=False, **kw) and 0,
                    "convert", tmp_path / "cli.log")
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def _shards(d):
    return sorted(d.glob("model-*.safetensors"))


def test_already_complete_is_verified_not_trusted(src, ref, tmp_path, capsys):
    dst = tmp_path / "out"
    shutil.copytree(ref, dst)
    capsys.readouterr()
    assert _run(src, dst, tmp_path, capsys)[:2] == (0, f"convert: {dst} is already complete for this plan (shards "
                                                        "and headers checked); nothing to do (convert.overwrite=true "
                                                        "rebuilds it)\n")
    gone = _shards(dst)[1]
    gone.unlink()
    code, out, err = _run(src, dst, tmp_path, capsys)
    assert code == 0 and not err
    assert out.splitlines()[0] == f"convert: {dst} is incomplete ({gone.name} is missing); rebuilding it"
    assert tree_bytes(dst) == tree_bytes(ref)
    cut = _shards(dst)[0]
    cut.write_bytes(cut.read_bytes()[:-100])
    code, out, _ = _run(src, dst, tmp_path, capsys)
    assert code == 0 and out.startswith(f"convert: {dst} is incomplete ({cut.name} is ")
    assert tree_bytes(dst) == tree_bytes(ref)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_another_plans_output_exits_2_and_stays(src, ref, tmp_path, capsys):
    before = tree_bytes(ref)
    code = run_task(lambda: convert_checkpoint(src, ref, {"*": "passthrough"}, progress=False), "convert",
                    tmp_path / "cli.log")
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == EXIT_USAGE == 2 and len(err) == 1
    assert err[0].startswith(f"nvfp4stack convert: error: convert.dst: {ref} already exists and was converted "
                             "with another plan")
    assert tree_bytes(ref) == before


@pytest.mark.parametrize("where", ["after_renames", "before_the_final_rename"])
def test_kill_during_finalize_keeps_the_shards(src, ref, tmp_path, capsys, monkeypatch, where):
    dst, tmp = tmp_path / "out", tmp_path / ".out.tmp"
    target = "write_index" if where == "after_renames" else "put_in_place"
    real = getattr(finalize, target)

    def killed(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(finalize, target, killed)
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(src, dst, RULES, max_shard_bytes=SHARD, progress=False)
    monkeypatch.setattr(finalize, target, real)
    assert not dst.exists() and len(_shards(tmp)) >= 3  # the shards already carry their final names
    stamps = {p.name: p.stat().st_mtime_ns for p in _shards(tmp)}
    capsys.readouterr()
    convert_checkpoint(src, dst, RULES, max_shard_bytes=SHARD, progress=False)
    out = capsys.readouterr().out
    if where == "after_renames":
        assert out.startswith(f"convert: resuming after shard {len(stamps)} (")
    else:
        assert out == f"convert: {tmp} was complete; putting it in place\n"
    assert tree_bytes(dst) == tree_bytes(ref) and not tmp.exists()
    assert {p.name: p.stat().st_mtime_ns for p in _shards(dst)} == stamps  # kept, not rewritten


def test_free_space_is_checked_before_the_first_shard(src, tmp_path, capsys, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 4096, 4096))
    dst = tmp_path / "out"
    code, out, err = _run(src, dst, tmp_path, capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"nvfp4stack convert: error: convert.dst: {dst} needs about ")
    assert f"the file system of {tmp_path / '.out.tmp'} has 4,096 bytes (0.00 GiB) free" in err[0]
    needed = int(err[0].split("needs about ")[1].split(" bytes")[0].replace(",", ""))
    src_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    assert src_bytes // 3 < needed < src_bytes  # BF16 -> NVFP4/FP8 experts and attention: less than the source
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.log", "src"]


def test_disk_full_while_writing_is_one_line_and_cleans_up(src, tmp_path, capsys, monkeypatch):
    real = shard_writer.ShardWriter.add
    calls = {"n": 0}

    def add(self, name, tensor):
        calls["n"] += 1
        if calls["n"] == 12:  # a few shards in
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, tensor)

    monkeypatch.setattr(shard_writer.ShardWriter, "add", add)
    dst = tmp_path / "out"
    code, _, err = _run(src, dst, tmp_path, capsys)
    assert calls["n"] == 12 and code == 2 and len(err) == 1
    assert err[0].startswith(f"nvfp4stack convert: error: convert.dst: no space left on the file system of {dst} "
                             f"while writing {tmp_path / '.out.tmp'}/shard-000")
    assert f"removed the partial output {tmp_path / '.out.tmp'}" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.log", "src"]


def test_clip_marks_the_cut(tmp_path):
    from nvfp4stack.tasks.convert import clip

    assert clip("abc", 5, tmp_path / "r.json") == "abc"
    assert clip("x" * 600, 500, tmp_path / "r.json") == "x" * 500 + f"... (truncated; full report in {tmp_path / 'r.json'})"
