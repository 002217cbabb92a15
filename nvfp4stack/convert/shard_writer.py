"""One output shard written once: the header up front, from the tensors the shard is planned to
hold, then each tensor's bytes straight after it, in the same file.

safetensors puts the header first and its length depends on every name, shape and offset in the
shard, so the stream plans the shard's tensors before converting them (``out_specs``). A writer
that finds, on closing, that the shard holds other tensors than planned still writes a correct
file (the header is rewritten in place, or the data moved behind a header of another length),
at the cost of that shard's second write; the bytes never depend on which happened. The file is
``<name>.partial`` until ``close`` fsyncs it and renames it to its final name; the bytes go
through ``file_sink`` (a background thread hashes and writes them).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, NamedTuple

import torch

from nvfp4stack.checkpoint.safetensors_io import TensorInfo, dtype_name, encode_header, file_sha256, tensor_bytes
from nvfp4stack.convert.file_sink import FileSink, TruncatedInput

log = logging.getLogger(__name__)
_CHUNK = 64 << 20


class TensorSpec(NamedTuple):
    """What one output tensor takes in a shard: name, safetensors dtype name, shape, bytes."""

    name: str
    dtype: str
    shape: tuple
    nbytes: int


def header_bytes(specs: Iterable[TensorSpec]) -> bytes:
    """The 8-byte length and JSON header of a shard holding ``specs`` in order."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": s.dtype, "shape": [int(d) for d in s.shape],
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    return encode_header(header)


def tensor_spec(name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, dtype_name(name, t), tuple(t.shape), t.numel() * t.element_size())


class ShardWriter:
    """Write one safetensors shard planned to hold ``planned``; ``close()`` publishes it atomically."""

    def __init__(self, path: str | Path, planned: list[TensorSpec]):
        self.path = Path(path)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._planned_head = header_bytes(planned)
        self._specs: list[TensorSpec] = []
        self._names: set[str] = set()
        self._offset = 0
        self._sink = FileSink(self._partial, self._planned_head)
        self.sha256 = ""
        self.rewritten = False  # the plan missed: this shard was written twice

    @property
    def nbytes(self) -> int:
        return self._offset

    def names(self) -> list[str]:
        return [s.name for s in self._specs]

    def _add(self, spec: TensorSpec, data=None, source: TensorInfo | None = None) -> None:
        """Append ``data`` (a bytes-like object), or ``source``'s byte range read straight from its file."""
        if spec.name in self._names:
            raise ValueError(f"{spec.name}: written twice to {self.path.name}")
        if source is not None:
            try:
                self._sink.append_file(source.file, source.start, source.nbytes)
            except TruncatedInput as e:
                raise IOError(f"{spec.name}: {e} (truncated); re-download or re-write it") from None
            n = source.nbytes
        else:
            self._sink.append(data)
            n = len(data)
        if n != spec.nbytes:
            raise ValueError(f"{spec.name}: {n} bytes written to {self.path.name}, its header says {spec.nbytes}")
        self._specs.append(spec)
        self._names.add(spec.name)
        self._offset += n

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._add(tensor_spec(name, tensor), tensor_bytes(tensor))

    def add_raw(self, name: str, info: TensorInfo) -> None:
        """A pass-through tensor: its stored bytes, read from ``info``'s file range."""
        self._add(TensorSpec(name, info.dtype, tuple(info.shape), info.nbytes), source=info)

    def close(self) -> Path:
        self.sha256 = self._sink.close()
        head = header_bytes(self._specs)
        if head != self._planned_head:
            self._fix_header(head)
        os.replace(self._partial, self.path)
        return self.path

    def _fix_header(self, head: bytes) -> None:
        """The shard holds other tensors than planned: put the right header in front of the data."""
        log.warning("%s: the shard holds other tensors than planned; rewriting it (its bytes are unchanged, "
                    "it costs a second write)", self.path.name)
        self.rewritten = True
        old = len(self._planned_head)
        if len(head) == old:
            with open(self._partial, "r+b") as f:
                f.write(head)
                f.flush()
                os.fsync(f.fileno())
        else:  # the data must move: copy it behind the new header
            moved = self._partial.with_name(self._partial.name + ".moved")
            with open(self._partial, "rb") as src, open(moved, "wb") as out:
                out.write(head)
                src.seek(old)
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(moved, self._partial)
        self.sha256 = file_sha256(self._partial)

    def abort(self) -> None:
        self._sink.abort()
        for p in (self._partial, self._partial.with_name(self._partial.name + ".moved")):
            p.unlink(missing_ok=True)
