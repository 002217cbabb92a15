"""Streaming reader/writer for sharded safetensors checkpoints (index json), bounded memory.

The reader reads one tensor at a time with plain file reads (no mmap, so resident memory is
that tensor only); the writer streams tensor bytes to disk and prepends the header at the end,
so neither ever holds a whole shard. Files are standard safetensors (``safe_open`` reads them).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_COPY_CHUNK = 64 << 20

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, dtype name, shape, absolute byte range in the file."""

    file: Path
    dtype: str
    shape: tuple
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def torch_dtype(self) -> torch.dtype:
        try:
            return DTYPES[self.dtype]
        except KeyError:
            raise ValueError(f"{self.file}: safetensors dtype {self.dtype!r} is not supported; "
                             f"supported: {', '.join(DTYPES)}") from None


MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit


def read_header(path: str | Path) -> tuple[dict, int]:
    """(header dict without __metadata__, byte offset where tensor data starts)."""
    fix = "the file is corrupted or truncated: re-copy or re-download this shard"
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: no 8-byte safetensors header length; {fix}")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: header length {n} bytes exceeds {MAX_HEADER_BYTES}; {fix}")
        blob = f.read(n)
    try:
        header = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: corrupted safetensors header ({e.__class__.__name__}: {e}); {fix}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header is not a JSON object; {fix}")
    header.pop("__metadata__", None)
    return header, 8 + n


def file_infos(path: str | Path) -> dict[str, TensorInfo]:
    path = Path(path)
    header, base = read_header(path)
    return {name: TensorInfo(path, h["dtype"], tuple(h["shape"]), base + h["data_offsets"][0],
                             base + h["data_offsets"][1]) for name, h in header.items()}


def _hub_blobs(root: Path) -> Path | None:
    """``<repo>/blobs`` when ``root`` is a Hugging Face hub snapshot (``<repo>/snapshots/<rev>``),
    whose files are links into the repo's content-addressed blobs by design."""
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        return root.parent.parent / "blobs"
    return None


def check_inside(directory: str | Path, path: str | Path, where: str) -> Path:
    """``path`` when it, after links, lies inside the checkpoint ``directory`` (or, for a hub
    snapshot, in its repo's blobs); a link that leaves it is refused (a checkpoint is untrusted)."""
    root, path = Path(directory).resolve(), Path(path)
    real = path.resolve()
    blobs = _hub_blobs(root)
    if real.is_relative_to(root) or (blobs is not None and real.is_relative_to(blobs.resolve())):
        return path
    raise ValueError(f"{where}: {path} links to {real}, outside the checkpoint directory {root}; a "
                     "checkpoint's files must lie inside it: copy the file in (cp --dereference) "
                     "instead of linking it")


def checkpoint_file(directory: str | Path, name, where: str) -> Path:
    """``directory/name`` for a file name the checkpoint itself lists (an index entry), refused
    unless ``name`` is a plain file name (no directory part, not absolute, not '..') whose file
    lies inside ``directory``."""
    directory = Path(directory)
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name
            or "\0" in name or Path(name).is_absolute()):
        raise ValueError(f"{where}: shard {name!r} is not a plain file name inside {directory}; an index "
                         "names shards in its own directory only: set the entry to the shard's file name "
                         "(e.g. 'model-00001-of-00002.safetensors') and put that file in the directory")
    return check_inside(directory, directory / name, where)


def shard_files(directory: str | Path) -> list[Path]:
    """The checkpoint's shard files (index json, one model.safetensors, or loose *.safetensors),
    every one checked to be a plain name whose file lies inside ``directory``."""
    directory = Path(directory)
    index = directory / INDEX_NAME
    if index.exists():
        check_inside(directory, index, INDEX_NAME)
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            items = sorted(weight_map.items())
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{index}: unreadable ({type(e).__name__}: {e}); expected a JSON object with "
                             "a weight_map of tensor name -> shard file name: regenerate the index") from None
        first: dict = {}
        for tensor, f in items:
            first.setdefault(f if isinstance(f, str) else repr(f), (tensor, f))
        return [checkpoint_file(directory, f, f"{INDEX_NAME} weight_map[{tensor!r}]")
                for _, (tensor, f) in sorted(first.items())]
    names = [SINGLE_NAME] if (directory / SINGLE_NAME).exists() else sorted(
        p.name for p in directory.glob("*.safetensors"))
    return [check_inside(directory, directory / n, n) for n in names]


class ShardedReader:
    """Read a checkpoint directory (index json, one model.safetensors, or loose *.safetensors)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.files = shard_files(self.dir)
        if not self.files:
            raise FileNotFoundError(f"{self.dir}: no {INDEX_NAME} and no *.safetensors; point "
                                    "the checkpoint path at a directory holding safetensors shards")
        self.infos: dict[str, TensorInfo] = {}
        for f in self.files:
            for name, info in file_infos(f).items():
                if name in self.infos:
                    raise ValueError(f"{name}: stored twice ({self.infos[name].file.name} and "
                                     f"{f.name}); remove the duplicate shard")
                self.infos[name] = info

    def names(self) -> list[str]:
        """Names in storage order (file, then offset): sequential reads, deterministic."""
        return sorted(self.infos, key=lambda n: (str(self.infos[n].file), self.infos[n].start))

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    @property
    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self.infos.values())

    def get(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        info = self.infos[name]
        buf = torch.empty(info.nbytes, dtype=torch.uint8)
        with open(info.file, "rb") as f:
            f.seek(info.start)
            if info.nbytes and f.readinto(buf.numpy()) != info.nbytes:
                raise IOError(f"{name}: {info.file} is truncated; re-download or re-write it")
        return buf.view(info.torch_dtype).reshape(info.shape).to(device)

    def iter_raw(self, name: str) -> Iterator[bytes]:
        """The tensor's bytes in chunks, for pass-through copies that never materialise it."""
        info = self.infos[name]
        with open(info.file, "rb") as f:
            f.seek(info.start)
            left = info.nbytes
            while left:
                chunk = f.read(min(left, _COPY_CHUNK))
                if not chunk:
                    raise IOError(f"{name}: {info.file} is truncated")
                left -= len(chunk)
                yield chunk


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A tensor's bytes as safetensors stores them (on the CPU, contiguous)."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())


def dtype_name(name: str, t: torch.Tensor) -> str:
    """The safetensors dtype name of tensor ``name``; ValueError naming it when there is none."""
    if t.dtype not in DTYPE_NAMES:
        raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name; cast or view it")
    return DTYPE_NAMES[t.dtype]


def encode_header(header: dict) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file, its data start aligned to 8 bytes."""
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


class ShardWriter:
    """Write one safetensors file tensor by tensor; ``close()`` publishes it atomically."""

    def __init__(self, path: str | Path, metadata: dict | None = None):
        self.path = Path(path)
        self._data_path = self.path.with_name(self.path.name + ".data")
        self._data = open(self._data_path, "wb")
        self._header: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
        self._offset = 0
        self.sha256 = ""

    @property
    def nbytes(self) -> int:
        return self._offset

    def names(self) -> list[str]:
        return [k for k in self._header if k != "__metadata__"]

    def _add(self, name: str, dtype: str, shape: Iterable[int], chunks: Iterable) -> None:
        if name in self._header:
            raise ValueError(f"{name}: written twice to {self.path.name}")
        start = self._offset
        for c in chunks:
            self._data.write(c)
            self._offset += len(c)
        self._header[name] = {"dtype": dtype, "shape": list(shape),
                              "data_offsets": [start, self._offset]}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._add(name, dtype_name(name, tensor), tensor.shape, [tensor_bytes(tensor)])

    def add_raw(self, name: str, info: TensorInfo, chunks: Iterable[bytes]) -> None:
        self._add(name, info.dtype, info.shape, chunks)

    def close(self) -> Path:
        self._data.close()
        partial = self.path.with_name(self.path.name + ".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out, open(self._data_path, "rb") as data:
            head = [encode_header(self._header)]
            for chunk in itertools.chain(head, iter(lambda: data.read(_COPY_CHUNK), b"")):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)
        os.remove(self._data_path)
        self.sha256 = digest.hexdigest()
        return self.path

    def abort(self) -> None:
        self._data.close()
        for p in (self._data_path, self.path.with_name(self.path.name + ".partial")):
            p.unlink(missing_ok=True)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_COPY_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_index(directory: str | Path, weight_map: dict[str, str], total_size: int) -> Path:
    path = Path(directory) / INDEX_NAME
    body = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def save_sharded(tensors: Iterable[tuple[str, torch.Tensor]] | dict, directory: str | Path,
                 max_shard_bytes: int = 4 << 30) -> dict[str, str]:
    """Write (name, tensor) pairs, in order, as model-XXXXX-of-YYYYY shards plus the index.

    A shard is closed once it holds >= ``max_shard_bytes``, so the layout depends only on the
    tensors and their order. Returns the weight map (name -> file).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    items = tensors.items() if isinstance(tensors, dict) else tensors
    files: list[Path] = []
    weight_map: dict[str, int] = {}
    writer, total = None, 0
    for name, t in items:
        if writer is None:
            writer = ShardWriter(directory / f"shard-{len(files):05d}.tmp")
        writer.add(name, t)
        weight_map[name] = len(files)
        total += t.numel() * t.element_size()
        if writer.nbytes >= max_shard_bytes:
            files.append(writer.close())
            writer = None
    if writer is not None:
        files.append(writer.close())
    names = [shard_name(i, len(files)) for i in range(len(files))]
    for f, n in zip(files, names):
        os.replace(f, directory / n)
    final = {k: names[v] for k, v in weight_map.items()}
    write_index(directory, final, total)
    return final
