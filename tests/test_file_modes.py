"""Checkpoints and run files follow the user's umask, like save_pretrained (issue #18): a serving
account in the same group can read what the quantizing account wrote."""
import os
import stat

import pytest

from nvfp4stack.io_atomic import atomic_dir, atomic_write_text


@pytest.fixture
def umask():
    def set_(mask):
        old = os.umask(mask)
        restore.append(old)
    restore: list[int] = []
    yield set_
    for old in restore[:1]:
        os.umask(old)


@pytest.mark.parametrize("mask,dir_mode,file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_atomic_outputs_follow_the_umask(tmp_path, umask, mask, dir_mode, file_mode):
    umask(mask)
    with atomic_dir(tmp_path / "ckpt") as tmp:
        (tmp / "model.safetensors").write_bytes(b"\0" * 8)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.json").write_text("{}")
    atomic_write_text(tmp_path / "plan.json", "{}")
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(tmp_path / "ckpt") == dir_mode and mode(tmp_path / "ckpt" / "sub") == dir_mode
    assert mode(tmp_path / "ckpt" / "model.safetensors") == file_mode
    assert mode(tmp_path / "ckpt" / "sub" / "x.json") == file_mode
    assert mode(tmp_path / "plan.json") == file_mode
