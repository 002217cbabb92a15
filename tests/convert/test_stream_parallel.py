"""Several shards converted at once (issue #36, convert.workers): the output, the journal and a resume
are byte-identical to one shard at a time; a converter whose real output differs from its planned
specs, or a unit whose specs are unknown, falls back to one shard at a time; a failing worker leaves
no partial file and keeps the journaled shards; a full disk is one line; convert.workers=-1 exits 2."""
import errno
import json
import logging
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nvfp4stack.cli import EXIT_USAGE, run_task
from nvfp4stack.convert import CONVERTERS, out_specs, shard_writer, stream
from nvfp4stack.convert.bf16_to_nvfp4 import Bf16ToNvfp4
from nvfp4stack.convert.config import ConvertConfig
from nvfp4stack.convert.stream import convert_checkpoint
from nvfp4stack.schemes import Scheme
from tests.convert.test_stream import RULES, make_checkpoint, tree_bytes
from tests.support.numerics_data import fresh_seed

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("parallel") / "src"
    seed = fresh_seed()
    print(f"source checkpoint seed {seed}")
    make_checkpoint(d, seed, layers=2, experts=4, hidden=256, inter=128)
    return d


def _convert(src, dst, workers, max_shard_bytes=100_000, rules=RULES):
    return convert_checkpoint(src, dst, rules, max_shard_bytes=max_shard_bytes, progress=False, workers=workers)


@pytest.fixture
def closers(monkeypatch):
    """The name of the thread that closed each shard, by file name."""
    seen: dict[str, str] = {}
    real = shard_writer.ShardWriter.close

    def close(self):
        seen[self.path.name] = threading.current_thread().name
        return real(self)

    monkeypatch.setattr(shard_writer.ShardWriter, "close", close)
    return seen


@pytest.mark.parametrize("max_shard_bytes", [40_000, 100_000, 230_000])
def test_workers_write_the_same_bytes(src, tmp_path, closers, max_shard_bytes):
    ref = tmp_path / "ref"
    _convert(src, ref, 1, max_shard_bytes)
    n = json.loads((ref / "convert_report.json").read_text())["shards"]
    assert n >= 5
    closers.clear()
    out = tmp_path / "out"
    _convert(src, out, 4, max_shard_bytes)
    assert tree_bytes(out) == tree_bytes(ref)  # every shard, the index, report and manifest
    assert len(closers) == n and all(t.startswith("convert-shard") for t in closers.values())


@pytest.mark.parametrize("resume_workers", [4, 1])
def test_interrupted_at_a_journal_append_resumes_to_the_same_bytes(src, tmp_path, monkeypatch, capsys, seed,
                                                                  resume_workers):
    ref = tmp_path / "ref"
    _convert(src, ref, 1)
    n = json.loads((ref / "convert_report.json").read_text())["shards"]
    k = random.Random(seed).randint(1, n - 2)
    print(f"interrupted after {k} of {n} shards")
    real, calls = stream._append_journal, {"n": 0}

    def interrupt_after_k(tmp, entry):
        real(tmp, entry)
        calls["n"] += 1
        if calls["n"] == k:
            raise KeyboardInterrupt

    monkeypatch.setattr(stream, "_append_journal", interrupt_after_k)
    dst, tmp = tmp_path / "out", tmp_path / ".out.tmp"
    with pytest.raises(KeyboardInterrupt):
        _convert(src, dst, 4)
    assert not list(tmp.glob("*.partial*"))
    journaled = [json.loads(line)["file"] for line in (tmp / "journal.jsonl").read_text().splitlines()[1:]]
    assert journaled == [f"shard-{i:05d}.safetensors" for i in range(k)]  # strictly in order
    monkeypatch.setattr(stream, "_append_journal", real)
    capsys.readouterr()
    _convert(src, dst, resume_workers)
    assert capsys.readouterr().out.startswith(f"convert: resuming after shard {k} (")
    assert tree_bytes(dst) == tree_bytes(ref)


class DataSized(Bf16ToNvfp4):
    """NVFP4 plus a tail its specs cannot see: none in layer 0 (where its specs come from), over a
    whole shard's worth in layer 1, its length set by the values; so shards planned from the specs
    close elsewhere than the real ones in layer 1."""

    source, target = Scheme.BF16, Scheme.NVFP4

    def convert(self, tensors, name):
        w = tensors["weight"]
        out = super().convert(tensors, name)
        n = 0 if name.startswith("layers.0.") else 25_000 + int(w.float().abs().sum().item() * 1000) % 7_000
        out["tail"] = w.float().flatten()[:n].clone()  # 100-128 kB in layer 1: a shard by itself
        return out


def test_a_data_dependent_converter_falls_back_to_the_same_bytes(src, tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(CONVERTERS._items, "data_sized", DataSized)
    rules = {**RULES, "*.ffn.experts.*.w2": "data_sized"}
    ref = tmp_path / "ref"
    _convert(src, ref, 1, rules=rules)
    assert json.loads((ref / "convert_report.json").read_text())["shards"] >= 5
    with caplog.at_level(logging.WARNING, logger="nvfp4stack.convert.parallel"):
        _convert(src, tmp_path / "out", 4, rules=rules)
    assert tree_bytes(tmp_path / "out") == tree_bytes(ref)
    assert [r for r in caplog.records if "going on one shard at a time" in r.getMessage()]  # the fallback ran


def test_a_unit_with_unknown_specs_is_written_one_shard_at_a_time(src, tmp_path, monkeypatch, closers):
    ref = tmp_path / "ref"
    _convert(src, ref, 1)
    n = json.loads((ref / "convert_report.json").read_text())["shards"]
    real = out_specs.OutputSpecs.of

    def of(self, unit):
        return None if unit.prefix == "layers.1.ffn.experts.0.w2" else real(self, unit)

    monkeypatch.setattr(out_specs.OutputSpecs, "of", of)
    closers.clear()
    _convert(src, tmp_path / "out", 4)
    assert tree_bytes(tmp_path / "out") == tree_bytes(ref)
    by = sorted(closers.items())
    assert by[0][1].startswith("convert-shard") and by[-1][1] == threading.main_thread().name, by
    assert len(by) == n


class FailsOnce(Bf16ToNvfp4):
    """Fails on the real data of one unit late in the checkpoint (its meta run passes)."""

    source, target = Scheme.BF16, Scheme.NVFP4

    def convert(self, tensors, name):
        if name == "layers.1.ffn.experts.2.w2" and tensors["weight"].device.type != "meta":
            raise RuntimeError(f"{name}: broken on purpose")
        return super().convert(tensors, name)


def test_a_failing_worker_leaves_no_partial_file_and_keeps_the_journaled_shards(src, tmp_path, monkeypatch):
    rules = {**RULES, "*.ffn.experts.*.w2": "flaky"}
    monkeypatch.setitem(CONVERTERS._items, "flaky", Bf16ToNvfp4)
    ref = tmp_path / "ref"
    _convert(src, ref, 1, rules=rules)
    monkeypatch.setitem(CONVERTERS._items, "flaky", FailsOnce)
    dst, tmp = tmp_path / "out", tmp_path / ".out.tmp"
    with pytest.raises(RuntimeError, match="layers.1.ffn.experts.2.w2: broken on purpose"):
        _convert(src, dst, 4, rules=rules)
    assert not dst.exists() and not list(tmp.glob("*.partial*"))
    entries = [json.loads(line) for line in (tmp / "journal.jsonl").read_text().splitlines()[1:]]
    assert all((tmp / e["file"]).stat().st_size == e["size"] for e in entries)
    monkeypatch.setitem(CONVERTERS._items, "flaky", Bf16ToNvfp4)  # fixed: the rerun keeps what was journaled
    _convert(src, dst, 4, rules=rules)
    assert tree_bytes(dst) == tree_bytes(ref)


def test_disk_full_in_a_worker_is_one_line_and_cleans_up(src, tmp_path, capsys, monkeypatch):
    real, calls = shard_writer.ShardWriter.add, {"n": 0}
    lock = threading.Lock()

    def add(self, name, tensor):
        with lock:
            calls["n"] += 1
            full = calls["n"] == 12
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, tensor)

    monkeypatch.setattr(shard_writer.ShardWriter, "add", add)
    dst = tmp_path / "out"
    code = run_task(lambda: _convert(src, dst, 4) and 0, "convert", tmp_path / "cli.log")
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"nvfp4stack convert: error: convert.dst: no space left on the file system of {dst} "
                             f"while writing {tmp_path / '.out.tmp'}/shard-000")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.log"]


def test_workers_config_is_checked(tmp_path):
    with pytest.raises(ValueError, match=r"^convert\.workers: expected >= 0 .*found -1; set convert\.workers=0$"):
        ConvertConfig(workers=-1)
    assert ConvertConfig().workers == 0 and stream.resolve_workers(0) >= 1 and stream.resolve_workers(3) == 3
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "convert", "convert.workers=-1",
                        f"hydra.run.dir={tmp_path}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == EXIT_USAGE == 2 and len(lines) == 1, r.stderr
    assert "convert.workers: expected >= 0" in lines[0] and "found -1; set convert.workers=0" in lines[0]


def test_the_pool_holds_one_unit_per_worker(src, tmp_path, monkeypatch):
    """At most ``workers`` units are being converted at any moment."""
    real = stream.write_unit
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def counted(*a, **kw):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            time.sleep(0.005)  # long enough for the workers' units to overlap
            return real(*a, **kw)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(stream, "write_unit", counted)
    _convert(src, tmp_path / "out", 3, max_shard_bytes=40_000)
    assert state["most"] == 3


def test_the_task_passes_convert_workers(tmp_path, monkeypatch, closers):
    from nvfp4stack.tasks import convert as task
    from tests.tasks.test_convert import _src, cfg_for

    monkeypatch.chdir(tmp_path)
    _src(tmp_path, layers=6)
    rules = ["*.experts.*=bf16_to_nvfp4", "norm=passthrough"]
    assert task.run(cfg_for(tmp_path, rules=rules, max_shard_bytes=1500, dst="one", workers=1)) == 0
    assert set(closers.values()) == {threading.main_thread().name}
    closers.clear()
    assert task.run(cfg_for(tmp_path, rules=rules, max_shard_bytes=1500, dst="three", workers=3)) == 0
    assert len(closers) >= 3 and all(t.startswith("convert-shard") for t in closers.values())
    assert tree_bytes(tmp_path / "three") == tree_bytes(tmp_path / "one")


def test_auto_workers_count_the_cores_this_process_may_use(monkeypatch):
    """A container or taskset limit (CPU affinity) bounds the auto count, not the host's core count."""
    monkeypatch.setattr(stream.os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setattr(stream.os, "cpu_count", lambda: 64)
    assert stream.usable_cores() == 4 and stream.resolve_workers(0) == 2
    monkeypatch.setattr(stream.os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    assert stream.resolve_workers(0) == 8 and stream.resolve_workers(5) == 5

    def unsupported(pid):
        raise OSError("no affinity here")

    monkeypatch.setattr(stream.os, "sched_getaffinity", unsupported, raising=False)
    assert stream.usable_cores() == 64
