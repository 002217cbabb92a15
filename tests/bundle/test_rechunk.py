"""``python -m nvfp4stack.bundle rechunk``: the same wheels in chunks of another size, no download. A bundle made
by the builder's own chunk writer (random wheel bytes, one split across chunks) is rechunked smaller: the new
chunks verify, stay under the size, and reassemble to the same bytes; a corrupt source chunk is named and nothing
is written; the source cannot be its own output."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4stack.bundle.build import MiB, Target, rechunk, write_chunks
from nvfp4stack.bundle.install import load_manifest, reassemble, verify

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bundle(tmp_path):
    wheels = []
    for name, size in (("alpha-1.0-py3-none-any.whl", 150_000), ("beta-2.0-py3-none-any.whl", 40_000),
                       ("gamma-0.1-py3-none-any.whl", 90_000)):
        (tmp_path / name).write_bytes(os.urandom(size))
        wheels.append(tmp_path / name)
    src = tmp_path / "b"
    manifest = write_chunks(wheels, src, int(0.2 * MiB), Target("3.12", ("manylinux_2_28_x86_64",)),
                            {"requirements": ["alpha", "gamma"], "left_out": ["six"], "packages": ["alpha==1.0"]})
    return src, manifest, wheels


def test_smaller_chunks_same_wheels(bundle, tmp_path):
    src, before, wheels = bundle
    out = tmp_path / "small"
    after = rechunk(src, out, 0.06)
    assert len(after["chunks"]) > len(before["chunks"])
    verify(out, load_manifest(out))
    for c in out.iterdir():
        assert sum(f.stat().st_size for f in c.iterdir()) <= int(0.06 * MiB), c
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    got = reassemble(out, after, fresh)
    assert [w.read_bytes() for w in got] == [w.read_bytes() for w in wheels]
    assert [w.name for w in got] == [w.name for w in wheels]
    assert after["requirements"] == ["alpha", "gamma"] and after["left_out"] == ["six"]
    assert after["target"] == before["target"]
    assert [(w["file"], w["sha256"], w["size"]) for w in after["wheels"]] == [
        (w["file"], w["sha256"], w["size"]) for w in before["wheels"]]


def test_a_corrupt_source_chunk_is_named_and_nothing_written(bundle, tmp_path):
    src, before, _ = bundle
    victim = next(iter(sorted(before["chunks"])))
    f = next(p for p in (src / victim).iterdir() if p.name != "manifest.json")
    f.write_bytes(b"x" + f.read_bytes()[1:])
    out = tmp_path / "small"
    r = subprocess.run([sys.executable, "-m", "nvfp4stack.bundle", "rechunk", str(src), "--out", str(out),
                        "--chunk-mib", "0.06"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and f"{victim}/{f.name}: corrupt" in r.stderr
    assert not out.exists()


def test_the_source_is_not_its_own_output_nor_inside_it_nor_under_it(bundle):
    src, _, _ = bundle
    for out in (src, src / "new", src.parent):
        with pytest.raises(RuntimeError, match="would lose the source"):
            rechunk(src, out, 0.06)
    assert load_manifest(src)   # untouched
