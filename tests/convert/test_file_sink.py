"""file_sink: the bytes appended land in order, hashed, with or without O_DIRECT; a write error in
the background thread reaches the caller."""
import errno
import hashlib
import os

import pytest

from nvfp4stack.convert import file_sink
from nvfp4stack.convert.file_sink import FileSink


@pytest.mark.parametrize("direct", [True, False])
def test_appended_bytes_land_in_order_with_their_sha256(tmp_path, seed, monkeypatch, direct):
    monkeypatch.setattr(file_sink, "_BLOCK", 1 << 16)  # many hand-offs, unaligned tails
    if not direct:
        monkeypatch.delattr(os, "O_DIRECT", raising=False)
    rng = __import__("random").Random(seed)
    parts = [os.urandom(rng.choice([0, 1, 7, 4096, 65535, 65536, 200_001])) for _ in range(40)]
    sink = FileSink(tmp_path / "f", b"head")
    for p in parts:
        sink.append(memoryview(p))
    digest = sink.close()
    want = b"head" + b"".join(parts)
    assert (tmp_path / "f").read_bytes() == want
    assert digest == hashlib.sha256(want).hexdigest()


def test_a_full_disk_in_the_writer_thread_is_raised_to_the_caller(tmp_path, monkeypatch):
    monkeypatch.setattr(file_sink, "_BLOCK", 1 << 16)

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(FileSink, "_pwrite", staticmethod(full))
    sink = FileSink(tmp_path / "f")
    with pytest.raises(OSError) as e:
        for _ in range(8):
            sink.append(b"x" * (1 << 16))
        sink.close()
    assert e.value.errno == errno.ENOSPC
    sink.abort()
