"""Where a convert writes: whether ``dst`` may be replaced or is already complete, the free space
it needs, a full disk, and the final rename of the temporary output into place."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from nvfp4stack.checkpoint.safetensors_io import (
    DTYPES,
    INDEX_NAME,
    ShardedReader,
    TensorInfo,
    checkpoint_file,
    read_header,
)
from nvfp4stack.convert.base import CONVERTERS
from nvfp4stack.convert.units import PASSTHROUGH, Unit

MANIFEST = "manifest.json"
REPORT = "convert_report.json"


class ConvertRefused(ValueError):
    """convert will not (or can no longer) write this output: a user error (exit 2), the message
    naming the path, what was found and the fix."""


class DestinationExists(ConvertRefused, FileExistsError):
    """convert.dst holds something convert must not replace (FileExistsError for older callers)."""


def completed_report(dst: Path) -> dict:
    try:
        return json.loads((dst / REPORT).read_text())
    except (OSError, ValueError):
        return {}


def check_destination(dst: Path, digest: str, overwrite: bool) -> bool | None:
    """Whether the run replaces an existing ``dst`` (False: there is none); None: ``dst`` is already
    a complete output of this plan, verified, and there is nothing to do.

    Only a directory a convert wrote (it holds convert_report.json) is ever replaced; a damaged one
    of the same plan is rebuilt without asking, another plan's only with convert.overwrite=true.
    """
    if not dst.exists():
        return False
    if not dst.is_dir():
        raise DestinationExists(f"convert.dst: {dst} exists and is not a directory; choose another "
                                "convert.dst or move the file away")
    if not any(dst.iterdir()):
        return True
    report = completed_report(dst)
    if not report.get("plan_digest"):
        raise DestinationExists(
            f"convert.dst: {dst} exists and was not written by convert (no {REPORT}); convert never "
            f"deletes it{', even with convert.overwrite=true' if overwrite else ''}: move it away or "
            "choose another convert.dst")
    if report["plan_digest"] != digest:
        if overwrite:
            return True
        raise DestinationExists(f"convert.dst: {dst} already exists and was converted with another plan or "
                                "source; set convert.overwrite=true to replace it, or choose another convert.dst")
    problem = output_problem(dst)
    if problem is not None:
        print(f"convert: {dst} is incomplete ({problem}); rebuilding it", flush=True)
        return True
    if overwrite:
        return True
    print(f"convert: {dst} is already complete for this plan (shards and headers checked); nothing to do "
          "(convert.overwrite=true rebuilds it)", flush=True)
    return None


def output_problem(out: Path) -> str | None:
    """None when ``out`` holds every file its manifest and index list, each shard exactly as long as
    its header says; otherwise the first problem, in words."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
        index = json.loads((out / INDEX_NAME).read_text())
        shards = sorted(set(index["weight_map"].values()))
        total = 0
        for name in shards:
            path = checkpoint_file(out, name, f"{INDEX_NAME} of {out}")
            if not path.is_file():
                return f"{name} is missing"
            header, base = read_header(path)
            end = base + max((h["data_offsets"][1] for h in header.values()), default=0)
            size = path.stat().st_size
            if size != end:
                return f"{name} is {size} bytes, its header says {end}"
            total += size
        if total != index["metadata"]["total_size"]:
            return f"the shards hold {total} bytes, {INDEX_NAME} says {index['metadata']['total_size']}"
        missing = sorted(f for f in manifest if not (out / f).is_file())
        if missing:
            return f"{', '.join(missing)} missing"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def estimated_out_bytes(reader: ShardedReader, unit: Unit) -> int:
    """About how many bytes ``unit`` takes once converted: its weights counted from the input (a
    wide float tensor by its elements, a packed or scale tensor at the source format's bits per
    weight), stored at the target format's bits per weight."""
    infos: list[TensorInfo] = [reader.infos[n] for n, _ in unit.members]
    if unit.converter == PASSTHROUGH:
        return sum(i.nbytes for i in infos)
    conv = CONVERTERS.get(unit.converter)
    wide = [i for i in infos if i.dtype in DTYPES and DTYPES[i.dtype].is_floating_point
            and DTYPES[i.dtype].itemsize > 1]
    packed = sum(i.nbytes for i in infos) - sum(i.nbytes for i in wide)
    weights = sum(i.nbytes // DTYPES[i.dtype].itemsize for i in wide) + packed * 8 / conv.source.bits_per_weight
    return int(weights * conv.target.bits_per_weight / 8)


def check_free_space(tmp: Path, dst: Path, needed: int, fresh: bool) -> None:
    """Refuse to start when the output's file system has less free space than the output needs."""
    free = shutil.disk_usage(tmp).free
    if needed <= free:
        return
    if fresh:
        shutil.rmtree(tmp, ignore_errors=True)
    raise ConvertRefused(
        f"convert.dst: {dst} needs about {needed:,} bytes ({needed / 2**30:.2f} GiB) more, the file system of "
        f"{tmp} has {free:,} bytes ({free / 2**30:.2f} GiB) free; free space there or point convert.dst at a "
        "larger disk" + ("" if fresh else f" (the shards done so far stay in {tmp} for the rerun)"))


def disk_full(tmp: Path, dst: Path, path: Path, error: OSError):
    """ENOSPC while writing: remove the partial output (it fills the disk) and raise one line."""
    free = shutil.disk_usage(tmp.parent).free if tmp.parent.exists() else 0
    shutil.rmtree(tmp, ignore_errors=True)
    raise ConvertRefused(
        f"convert.dst: no space left on the file system of {dst} while writing {path} ({error.strerror}); "
        f"removed the partial output {tmp} ({free:,} bytes were free before); free space there or point "
        "convert.dst at a larger disk, then rerun") from None


def put_in_place(tmp: Path, dst: Path, replace: bool) -> None:
    """Rename the finished ``tmp`` to ``dst``; an existing ``dst`` is replaced only when ``replace``."""
    if dst.exists():
        if not replace:
            raise DestinationExists(f"convert.dst: {dst} appeared during the run; move it away or set "
                                    "convert.overwrite=true, then rerun (the finished output waits in "
                                    f"{tmp})")
        old = dst.with_name(f".{dst.name}.old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old)
    else:
        os.replace(tmp, dst)
