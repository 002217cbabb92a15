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


@pytest.mark.parametrize("direct", [True, False])
def test_file_ranges_read_straight_into_the_buffers_land_in_order(tmp_path, seed, monkeypatch, direct):
    """append_file (a pass-through tensor's byte range, read with preadv into the staging buffers)
    interleaved with append: the same bytes and sha256 as appending them, across buffer edges."""
    monkeypatch.setattr(file_sink, "_BLOCK", 1 << 16)
    if not direct:
        monkeypatch.delattr(os, "O_DIRECT", raising=False)
    rng = __import__("random").Random(seed)
    src = tmp_path / "src.bin"
    data = os.urandom(700_001)
    src.write_bytes(data)
    sink, want = FileSink(tmp_path / "f", b"head"), [b"head"]
    for _ in range(30):
        if rng.random() < 0.5:
            a = rng.randrange(len(data))
            n = rng.choice([0, 1, 4095, 65536, 200_003, len(data) - a])
            n = min(n, len(data) - a)
            sink.append_file(src, a, n)
            want.append(data[a:a + n])
        else:
            p = os.urandom(rng.choice([1, 7, 65535]))
            sink.append(p)
            want.append(p)
    digest = sink.close()
    assert (tmp_path / "f").read_bytes() == b"".join(want)
    assert digest == hashlib.sha256(b"".join(want)).hexdigest()


def test_a_file_range_past_the_end_is_refused_naming_the_file(tmp_path):
    src = tmp_path / "short.bin"
    src.write_bytes(b"x" * 1000)
    sink = FileSink(tmp_path / "f")
    with pytest.raises(file_sink.TruncatedInput, match="short.bin ends 100 bytes early"):
        sink.append_file(src, 500, 600)
    sink.abort()


def test_a_truncated_pass_through_tensor_names_itself_and_the_shard(tmp_path):
    from nvfp4stack.checkpoint.safetensors_io import TensorInfo
    from nvfp4stack.convert.shard_writer import ShardWriter, TensorSpec

    src = tmp_path / "in.safetensors"
    src.write_bytes(b"y" * 100)
    info = TensorInfo(src, "U8", (200,), 0, 200)  # the header promises more than the file holds
    w = ShardWriter(tmp_path / "out.safetensors", [TensorSpec("layers.0.norm.weight", "U8", (200,), 200)])
    with pytest.raises(OSError, match=r"layers\.0\.norm\.weight: .*in\.safetensors ends 100 bytes early"):
        w.add_raw("layers.0.norm.weight", info)
    w.abort()
    assert not list(tmp_path.glob("out.safetensors*"))
