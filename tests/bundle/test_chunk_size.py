"""A default bundle chunk and the working tree travel together in one device run (64 MiB at most)."""
import shutil
import subprocess
from pathlib import Path

import pytest

from nvfp4stack.bundle.build import DEFAULT_CHUNK_MIB, MiB

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT = 64 * MiB
MARGIN = 2 * MiB  # untracked scripts beside the tree, and a chunk a little over its size (its last wheel part)
# the size check counts what files take on disk: each rounded up to whole 4 KiB blocks (measured: a 56 MiB chunk
# beside a tree of 7.7 MiB in bytes, 9.0 MiB in blocks, was refused)
BLOCK = 4096


def tracked_bytes() -> int:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    sizes = [(ROOT / p).stat().st_size for p in out.decode().split("\0") if p and (ROOT / p).is_file()]
    return sum(-(-n // BLOCK) * BLOCK for n in sizes)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_a_default_chunk_fits_beside_the_tracked_tree():
    tree = tracked_bytes()
    assert tree > 1 * MiB  # the count found the tree
    room = RUN_LIMIT - tree - MARGIN
    assert DEFAULT_CHUNK_MIB * MiB <= room, (
        f"nvfp4stack/bundle/build.py DEFAULT_CHUNK_MIB: expected at most {room / MiB:.1f} MiB (64 MiB a device run, "
        f"less the tracked tree's {tree / MiB:.1f} MiB on disk and a {MARGIN // MiB} MiB margin), found {DEFAULT_CHUNK_MIB}; "
        "fix: lower it (and rechunk bundles: python -m nvfp4stack.bundle rechunk .bundle --out .bundle-N --chunk-mib N) "
        "or move large data out of the tree")
