"""The resume journal of a convert: one line per closed shard, under the plan's digest.

``journal.jsonl`` in the temporary output starts with the digest of (plan, input headers, shard
size); each closed shard appends its file name, size, sha256, tensor names, the next unit to run
and its converters' reports, fsynced, after the shard itself is in place. A rerun keeps every
shard up to the first gap and resumes from the unit after it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from nvfp4stack.checkpoint.safetensors_io import ShardedReader, shard_name
from nvfp4stack.convert.units import Unit

JOURNAL = "journal.jsonl"
_FORMAT_VERSION = 1


def plan_digest(reader: ShardedReader, units: list[Unit], max_shard_bytes: int) -> str:
    h = hashlib.sha256(f"v{_FORMAT_VERSION} {max_shard_bytes}".encode())
    for u in units:
        h.update(f"{u.converter}|{u.prefix}".encode())
        for name, _ in u.members:
            i = reader.infos[name]
            h.update(f"|{name}:{i.dtype}:{i.shape}:{i.nbytes}".encode())
    return h.hexdigest()


def read_journal(tmp: Path, digest: str) -> list[dict]:
    """The complete shards a previous run of this plan left in ``tmp``, in order."""
    path = tmp / JOURNAL
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            break  # a line cut by a kill mid-append: what follows it is not trusted either
    if not lines or lines[0].get("plan") != digest:
        return []
    entries = [e for e in lines[1:] if "file" in e]
    # a run killed in finalize had renamed shards to their final names: take them back
    finalizing = next((e["finalize"] for e in lines[1:] if "finalize" in e), None)
    done = []
    for i, entry in enumerate(entries):
        f = tmp / entry["file"]
        if not f.exists() and finalizing is not None and (tmp / shard_name(i, finalizing)).exists():
            os.replace(tmp / shard_name(i, finalizing), f)
        if not f.exists() or f.stat().st_size != entry["size"]:
            break  # the journal line is written only after the shard; stop at the first gap
        done.append(entry)
    return done


def start_journal(tmp: Path, digest: str, done: list[dict]) -> None:
    """Rewrite the journal with ``done`` only, and remove every other file of ``tmp`` (a shard
    cut by a kill, journal lines past the first gap)."""
    keep = {e["file"] for e in done} | {JOURNAL}
    for p in tmp.iterdir():
        if p.name not in keep:
            p.unlink()
    with open(tmp / JOURNAL, "w") as f:
        f.write(json.dumps({"plan": digest}) + "\n")
        f.writelines(json.dumps(e, sort_keys=True) + "\n" for e in done)


def append_journal(tmp: Path, entry: dict) -> None:
    with open(tmp / JOURNAL, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def journal_entries(tmp: Path) -> list[dict]:
    """The shard lines of the journal (finalize's view: every one is complete)."""
    return [e for e in map(json.loads, (tmp / JOURNAL).read_text().splitlines()[1:]) if "file" in e]
