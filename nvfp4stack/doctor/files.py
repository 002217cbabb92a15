"""Doctor, file level: shard headers, truncation, index.json consistency (no tensor data read), and
the stored groups with the format their tensors hold."""
from __future__ import annotations

import json
import struct
from collections import defaultdict
from pathlib import Path

from nvfp4stack.checkpoint.safetensors_io import DTYPES, INDEX_NAME, TensorInfo, check_inside
from nvfp4stack.doctor.report import DoctorReport
from nvfp4stack.formats.codec import Entry
from nvfp4stack.plan.groups import group_name
from nvfp4stack.schemes import Scheme

MAX_HEADER = 100 * 2**20  # safetensors' own limit on the JSON header


def read_shard(path: Path, report: DoctorReport) -> dict[str, TensorInfo]:
    """Tensor infos of one shard; every defect becomes a finding (and the shard is skipped)."""
    size = path.stat().st_size
    fix_copy = f"re-copy or re-download {path.name} (compare its sha256 with the source)"
    if size < 8:
        report.error("header", path.name, f"{size} bytes", "an 8-byte header length + JSON header", fix_copy)
        return {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER or 8 + n > size:
            report.error("header", path.name, f"header length {n} bytes in a {size}-byte file",
                         "a header length that fits the file", fix_copy)
            return {}
        raw = f.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        report.error("header", path.name, f"an unparsable JSON header ({e})", "a safetensors JSON header", fix_copy)
        return {}
    header.pop("__metadata__", None)
    out: dict[str, TensorInfo] = {}
    data_len = size - 8 - n
    past_end: list[tuple[str, int]] = []
    for name, h in header.items():
        try:
            dtype, shape, (start, end) = h["dtype"], tuple(h["shape"]), h["data_offsets"]
        except (KeyError, TypeError, ValueError):
            report.error("header", f"{path.name}:{name}", f"entry {h!r}", "dtype, shape and data_offsets", fix_copy)
            continue
        if dtype not in DTYPES:
            report.error("dtype", name, f"safetensors dtype {dtype!r}", f"one of {', '.join(DTYPES)}",
                         "re-export the tensor in a supported dtype")
            continue
        numel = 1
        for d in shape:
            numel *= d
        itemsize = DTYPES[dtype].itemsize
        if end - start != numel * itemsize:
            report.error("header", name, f"{end - start} bytes for {dtype} {list(shape)}",
                         f"{numel * itemsize} bytes", fix_copy)
            continue
        if end > data_len:
            past_end.append((name, end))
            continue
        out[name] = TensorInfo(path, dtype, shape, 8 + n + start, 8 + n + end)
    if past_end:
        # one root cause: what is missing downstream (structure, index, vLLM) follows from it
        need = max(e for _, e in past_end)
        report.error("truncated", path.name, f"{data_len} data bytes; {len(past_end)} of {len(header)} tensors "
                     f"lie past the end (e.g. {past_end[0][0]})", f"{need} data bytes (the header's last offset)",
                     fix_copy)
        report.lose([nm for nm, _ in past_end], path.name)
    return out


def read_checkpoint(ckpt: Path, report: DoctorReport) -> dict[str, TensorInfo]:
    """Every tensor of every shard (duplicates and index mismatches reported)."""
    files = sorted(ckpt.glob("*.safetensors"))
    index_path = ckpt / INDEX_NAME
    index: dict | None = None
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            report.error("index", INDEX_NAME, f"unreadable ({type(e).__name__}: {e})",
                         "a JSON object with a weight_map", "regenerate the index from the shards")
    if not files:
        report.error("files", str(ckpt), "no *.safetensors", "safetensors shards", "point checkpoint= at a checkpoint dir")
        return {}
    tensors: dict[str, TensorInfo] = {}
    broken: set[str] = set()   # shards whose header could not be read
    for f in files:
        before = len(report.errors)
        try:   # a checkpoint is untrusted: no header is read through a link that leaves it
            check_inside(ckpt, f, f.name)
        except ValueError as e:
            report.error("path", f.name, "a link out of the checkpoint directory", "a file inside it", str(e))
            broken.add(f.name)
            continue
        infos = read_shard(f, report)
        if not infos and len(report.errors) > before:
            broken.add(f.name)
        for name, info in infos.items():
            if name in tensors:
                report.error("duplicate", name, f"stored in {tensors[name].file.name} and {f.name}",
                             "one copy", "remove the duplicate shard")
                continue
            tensors[name] = info
    if index is not None:
        check_index(index, tensors, files, ckpt, report, broken)
    return tensors


def check_index(index: dict, tensors: dict[str, TensorInfo], files: list[Path], ckpt: Path,
                report: DoctorReport, broken: set[str] = frozenset()) -> None:
    """``broken``: shards already reported unreadable; their indexed tensors follow from that."""
    names = {f.name for f in files}
    for fname in sorted(set(index.values()) - names):
        n = sum(1 for v in index.values() if v == fname)
        report.error("index", fname, f"referenced by {INDEX_NAME} for {n} tensors but missing from {ckpt}",
                     "every shard named in the index present", f"copy {fname} into the checkpoint dir")
    for fname in (set(index.values()) - names) | set(broken):
        report.lose([t for t, v in index.items() if v == fname and t not in tensors], fname)
    for name, fname in sorted(index.items()):
        if fname not in names:
            continue
        info = tensors.get(name)
        if info is None:
            report.error("index", name, f"listed in {INDEX_NAME} under {fname}, absent from the shard",
                         "the tensor in its shard", "regenerate the index or re-copy the shard")
        elif info.file.name != fname:
            report.error("index", name, f"in {info.file.name}", f"in {fname} (index.json)",
                         "regenerate the index from the shards")
    for name in sorted(set(tensors) - set(index)):
        report.error("index", name, f"in {tensors[name].file.name} but not in {INDEX_NAME}",
                     "every stored tensor listed", "regenerate the index (vLLM's loader may skip unlisted shards)")
    for f in sorted(names - set(index.values())):
        report.warn("index", f, f"not referenced by {INDEX_NAME}", "every shard referenced",
                    "remove the stray shard or regenerate the index")


def sniff(sufs: dict[str, TensorInfo]) -> Scheme | None:
    """Stored format of one group from its tensors' header entries (None: cannot tell, e.g. packed
    E2M1 without any scale tensor is NVFP4 or MXFP4: the role's majority decides)."""
    return Scheme.detect({s: Entry(i.dtype, tuple(i.shape)) for s, i in sufs.items()})


def by_group(tensors: dict[str, TensorInfo]) -> dict[str, dict[str, TensorInfo]]:
    out: dict[str, dict[str, TensorInfo]] = defaultdict(dict)
    for name, info in tensors.items():
        g, suf = group_name(name)
        out[g][suf] = info
    return out
