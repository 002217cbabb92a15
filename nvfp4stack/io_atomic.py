"""Atomic file writes: write a temporary sibling, fsync, then rename over the target.

What lands follows the user's umask (as a plain open() would), not tempfile's private 0600/0700."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def atomic_write_text(path: Path | str, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(root: Path) -> None:
    """mkdtemp/mkstemp create 0700 dirs and 0600 files: give ``root`` and everything under it the
    modes a plain open()/mkdir() would (0666/0777 minus the umask), like save_pretrained, so a
    serving account can read what a quantizing account wrote."""
    mask = _umask()
    root = Path(root)
    if root.is_file():
        os.chmod(root, 0o666 & ~mask)
        return
    os.chmod(root, 0o777 & ~mask)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o777 & ~mask)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, (0o777 if os.access(p, os.X_OK) else 0o666) & ~mask)


@contextmanager
def atomic_dir(out: Path | str) -> Iterator[Path]:
    """Build a directory in a temporary sibling, then put it at ``out`` in one rename.

    On an exception the temporary directory is removed and ``out`` is untouched; an existing
    ``out`` is replaced only after the new one is complete (moved aside, renamed, then deleted).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        follow_umask(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
