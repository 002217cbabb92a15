"""Streaming, resumable, atomic checkpoint conversion.

One work unit (a module, or the modules a multi-module converter fuses) is read, converted and
written at a time; pass-through tensors are copied byte for byte without being materialised.
Output goes to ``.<dst>.tmp`` next to ``dst``; a shard is closed at a unit boundary once it
reaches ``max_shard_bytes``, so the layout depends only on the input and the plan. Every closed
shard is recorded in ``journal.jsonl`` (with the next unit to run), so a killed run resumes from
the last complete shard and produces the same bytes as an uninterrupted one. The index, configs
and report follow, the manifest (sha256 per file) last, then the directory is renamed into place;
the journal stays until then, so a kill during that finalize keeps every shard too. An existing
``dst`` is called complete only after its shards are checked against their headers, and only a
directory a convert wrote is ever replaced. The free space is checked before the first shard.
Before anything is written the input passes the doctor's header-only checks (``validate``): a
checkpoint the doctor would reject after conversion is refused with nothing written.
"""
from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch
from tqdm import tqdm

from nvfp4stack.checkpoint.safetensors_io import (DTYPES, INDEX_NAME, ShardedReader, ShardWriter,
                                                  TensorInfo, checkpoint_file, file_sha256, read_header,
                                                  shard_name, write_index)
from nvfp4stack.checkpoint.side_files import copy_side_files, side_files
from nvfp4stack.convert import CONVERTERS
from nvfp4stack.convert.validate import KEEP, REFUSE, input_problems
from nvfp4stack.schemes import Scheme

log = logging.getLogger(__name__)

PASSTHROUGH = "passthrough"
JOURNAL = "journal.jsonl"
MANIFEST = "manifest.json"
REPORT = "convert_report.json"
_FORMAT_VERSION = 1
Chooser = Callable[[str], "str | None"]


class ConvertRefused(ValueError):
    """convert will not (or can no longer) write this output: a user error (exit 2), the message
    naming the path, what was found and the fix."""


class DestinationExists(ConvertRefused, FileExistsError):
    """convert.dst holds something convert must not replace (FileExistsError for older callers)."""


@dataclass
class Unit:
    """Tensors converted together: ``prefix`` + '.' + local key is the checkpoint name."""

    converter: str
    prefix: str
    members: list = field(default_factory=list)  # (checkpoint name, local key)


def split_name(name: str) -> tuple[str, str]:
    """'layers.0.attn.wkv.weight' -> ('layers.0.attn.wkv', 'weight')."""
    module, _, suffix = name.rpartition(".")
    return module, suffix


def parse_rules(rules, where: str = "rules") -> dict[str, str]:
    """A mapping, or 'glob=converter' strings (order kept) -> {glob: converter}."""
    if isinstance(rules, Mapping):
        return dict(rules)
    out = {}
    for r in rules:
        pattern, sep, conv = str(r).partition("=")
        if not sep or not pattern or not conv:
            raise ValueError(f"{where}: expected 'glob=converter' entries, found {r!r}; e.g. "
                             "'*.ffn.experts.*=bf16_to_nvfp4'")
        out[pattern.strip()] = conv.strip()
    return out


def chooser_from_rules(rules) -> Chooser:
    """Glob patterns on module names -> converter name or 'passthrough'; no match -> None."""
    items = list(parse_rules(rules).items())

    def choose(module: str) -> str | None:
        for pattern, conv in items:
            if fnmatch.fnmatchcase(module, pattern):
                return conv
        return None

    return choose


def plan_units(names: list[str], choose: Chooser) -> tuple[list[Unit], list[str]]:
    """Group tensor names into work units in first-appearance order; also return unknown names."""
    units: dict[tuple[str, str], Unit] = {}
    unknown: list[str] = []
    decided: dict[str, str | None] = {}
    for name in names:
        module, suffix = split_name(name)
        if module not in decided:
            decided[module] = choose(module)
        conv = decided[module]
        if conv is None and choose(name) == PASSTHROUGH:
            conv = PASSTHROUGH  # a parameter stored without a suffix (attn_sink) is a group of its own
        if conv is None:
            unknown.append(name)
            conv = PASSTHROUGH
        if conv == PASSTHROUGH:
            key, local = (PASSTHROUGH, name), name
        elif getattr(CONVERTERS.get(conv), "spans_modules", False):
            parent, last = split_name(module)
            key, local = (conv, parent), f"{last}.{suffix}"
        else:
            key, local = (conv, module), suffix
        units.setdefault(key, Unit(key[0], key[1])).members.append((name, local))
    return list(units.values()), unknown


def _unit_sources(units: list[Unit]) -> dict[str, Scheme]:
    """group -> the format its converter reads (a converter fusing modules reads several: skipped)."""
    out = {}
    for u in units:
        conv = CONVERTERS.get(u.converter) if u.converter != PASSTHROUGH else None
        if conv is not None and not getattr(conv, "spans_modules", False):
            out[u.prefix] = conv.source
    return out


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _plan_digest(reader: ShardedReader, units: list[Unit], max_shard_bytes: int) -> str:
    h = hashlib.sha256(f"v{_FORMAT_VERSION} {max_shard_bytes}".encode())
    for u in units:
        h.update(f"{u.converter}|{u.prefix}".encode())
        for name, _ in u.members:
            i = reader.infos[name]
            h.update(f"|{name}:{i.dtype}:{i.shape}:{i.nbytes}".encode())
    return h.hexdigest()


def _read_journal(tmp: Path, digest: str) -> list[dict]:
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
    # a run killed in _finalize had renamed shards to their final names: take them back
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


def _append_journal(tmp: Path, entry: dict) -> None:
    with open(tmp / JOURNAL, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def convert_checkpoint(src: str | Path, dst: str | Path, choose: Chooser | Mapping[str, str] | list, *,
                       unknown_tensors: str = REFUSE, sources: Mapping[str, Scheme] | None = None,
                       overwrite: bool = False,
                       max_shard_bytes: int = 4 << 30, device: str = "auto",
                       config: dict | None = None, hf_quant_config: dict | None = None,
                       progress: bool = True) -> dict:
    """Convert checkpoint ``src`` into ``dst``; returns the report written to convert_report.json.

    choose(module) -> converter name, 'passthrough', or None (unknown: refused, or copied unchanged
    when ``unknown_tensors`` is 'keep'). A mapping or 'glob=converter' list is taken as glob rules.
    ``sources``: group -> the scheme the plan reads it as (default: each converter's source format).
    ``config`` replaces config.json (default: the source's, copied); ``hf_quant_config`` is written
    when given. Raises ConvertRefused, with nothing written, when the input fails the pre-flight.
    """
    src, dst = Path(src), Path(dst)
    if not callable(choose):
        choose = chooser_from_rules(choose)
    reader = ShardedReader(src)
    units, unknown = plan_units(reader.names(), choose)
    digest = _plan_digest(reader, units, max_shard_bytes)
    problems = input_problems(src, _unit_sources(units) if sources is None else sources, unknown, unknown_tensors,
                              reader.infos)
    if problems:
        more = (f" (+{len(problems) - 1} more; 'python main.py doctor checkpoint={src}' lists every finding)"
                if len(problems) > 1 else "")
        raise ConvertRefused(f"convert.src: {src} is not a valid input, nothing was written: {problems[0]}{more}")
    side, left_behind = side_files(src)  # refuses a config/tokenizer linking out before any write
    tmp = dst.with_name(f".{dst.name}.tmp")
    replace = _check_destination(dst, digest, overwrite)
    if replace is None:
        return {**_completed_report(dst), "already_complete": True}
    if left_behind:
        log.warning("%s: not copied into the output (not a config, tokenizer, license or read-me file): %s",
                    src, ", ".join(left_behind))
    if unknown:  # kept (input_problems refuses them otherwise): the user asked for it
        log.warning("%d tensor(s) matched no plan rule: %s%s; copying them unchanged (convert.unknown_tensors=%s)",
                    len(unknown), ", ".join(unknown[:20]), " ..." if len(unknown) > 20 else "", KEEP)
    converters = {c: CONVERTERS.get(c)() for c in sorted({u.converter for u in units} - {PASSTHROUGH})}
    dev = resolve_device(device)

    if (tmp.is_dir() and not (tmp / JOURNAL).exists() and _completed_report(tmp).get("plan_digest") == digest
            and _output_problem(tmp) is None):  # killed after finalize wrote everything, before the rename
        print(f"convert: {tmp} was complete; putting it in place", flush=True)
        _put_in_place(tmp, dst, replace)
        return _completed_report(dst)
    done = _read_journal(tmp, digest)
    if not done and tmp.exists():
        print(f"convert: discarding the stale partial output {tmp} (another plan or source, or no "
              "complete shard yet); starting over", flush=True)
        shutil.rmtree(tmp)
    elif done:
        print(f"convert: resuming after shard {len(done)} ({done[-1]['next_unit']} of {len(units)} "
              f"tensor groups done) from {tmp}", flush=True)
    tmp.mkdir(parents=True, exist_ok=True)
    if not done:
        (tmp / JOURNAL).write_text(json.dumps({"plan": digest}) + "\n")
    else:  # drop anything after the last complete shard (half-written shard, .data/.partial)
        keep = {e["file"] for e in done} | {JOURNAL}
        for p in tmp.iterdir():
            if p.name not in keep:
                p.unlink()
        with open(tmp / JOURNAL, "w") as f:  # also drops journal lines past the first gap
            f.write(json.dumps({"plan": digest}) + "\n")
            f.writelines(json.dumps(e, sort_keys=True) + "\n" for e in done)

    start = done[-1]["next_unit"] if done else 0
    _check_free_space(tmp, dst, sum(_estimated_out_bytes(reader, u) for u in units[start:])
                      + sum(p.stat().st_size for p in side), fresh=not done)
    reports: dict = {k: v for e in done for k, v in e["reports"].items()}
    in_bytes = [sum(reader.infos[n].nbytes for n, _ in u.members) for u in units]
    bar = tqdm(total=sum(in_bytes), initial=sum(in_bytes[:start]), unit="B", unit_scale=True,
               unit_divisor=1024, desc=f"convert -> {dst.name}", disable=not progress)
    shard_i, writer, unit_reports = len(done), None, {}

    def close_shard(next_unit: int) -> None:
        nonlocal writer, unit_reports, shard_i
        path = writer.close()
        _append_journal(tmp, {"file": path.name, "size": path.stat().st_size, "sha256": writer.sha256,
                              "names": writer.names(), "next_unit": next_unit, "reports": unit_reports})
        reports.update(unit_reports)
        writer, unit_reports, shard_i = None, {}, shard_i + 1

    try:
        with torch.inference_mode():
            for ui in range(start, len(units)):
                u = units[ui]
                if writer is None:
                    writer = ShardWriter(tmp / f"shard-{shard_i:05d}.safetensors")
                if u.converter == PASSTHROUGH:
                    for name, _ in u.members:
                        writer.add_raw(name, reader.infos[name], reader.iter_raw(name))
                else:
                    conv = converters[u.converter]
                    conv.report = None
                    group = {local: reader.get(name, dev) for name, local in u.members}
                    out = conv.convert(group, u.prefix)
                    del group
                    for key, t in out.items():
                        writer.add(_join(u.prefix, key), t)
                    if getattr(conv, "report", None):
                        unit_reports[f"{u.converter}:{u.prefix}"] = conv.report
                    del out
                bar.update(in_bytes[ui])
                if writer.nbytes >= max_shard_bytes:
                    close_shard(ui + 1)
            if writer is not None:
                close_shard(len(units))
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        if writer is not None:
            writer.abort()
        _disk_full(tmp, dst, writer.path if writer is not None else tmp, e)
    bar.close()
    try:
        return _finalize(src, dst, tmp, replace, side, unknown, reports, config, hf_quant_config, digest)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        _disk_full(tmp, dst, Path(e.filename) if e.filename else tmp, e)


def _completed_report(dst: Path) -> dict:
    try:
        return json.loads((dst / REPORT).read_text())
    except (OSError, ValueError):
        return {}


def _check_destination(dst: Path, digest: str, overwrite: bool) -> bool | None:
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
    report = _completed_report(dst)
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
    problem = _output_problem(dst)
    if problem is not None:
        print(f"convert: {dst} is incomplete ({problem}); rebuilding it", flush=True)
        return True
    if overwrite:
        return True
    print(f"convert: {dst} is already complete for this plan (shards and headers checked); nothing to do "
          "(convert.overwrite=true rebuilds it)", flush=True)
    return None


def _output_problem(out: Path) -> str | None:
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


def _estimated_out_bytes(reader: ShardedReader, unit: Unit) -> int:
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


def _check_free_space(tmp: Path, dst: Path, needed: int, fresh: bool) -> None:
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


def _disk_full(tmp: Path, dst: Path, path: Path, error: OSError):
    """ENOSPC while writing: remove the partial output (it fills the disk) and raise one line."""
    free = shutil.disk_usage(tmp.parent).free if tmp.parent.exists() else 0
    shutil.rmtree(tmp, ignore_errors=True)
    raise ConvertRefused(
        f"convert.dst: no space left on the file system of {dst} while writing {path} ({error.strerror}); "
        f"removed the partial output {tmp} ({free:,} bytes were free before); free space there or point "
        "convert.dst at a larger disk, then rerun") from None


def _put_in_place(tmp: Path, dst: Path, replace: bool) -> None:
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


def _finalize(src: Path, dst: Path, tmp: Path, replace: bool, side: list[Path], unknown: list[str],
              reports: dict, config: dict | None, hf_quant_config: dict | None, digest: str) -> dict:
    entries = [e for e in map(json.loads, (tmp / JOURNAL).read_text().splitlines()[1:]) if "file" in e]
    n = len(entries)
    # a kill from here on resumes with every shard kept (_read_journal takes the renames back)
    _append_journal(tmp, {"finalize": n})
    weight_map, total = {}, 0
    for i, e in enumerate(entries):
        final = shard_name(i, n)
        os.replace(tmp / e["file"], tmp / final)
        weight_map.update({name: final for name in e["names"]})
        total += e["size"]
    write_index(tmp, weight_map, total)
    # tokenizer, generation config, license...: the allow-listed side files travel with the weights
    copy_side_files([p for p in side if p.name != "config.json" or config is None], tmp)
    if config is not None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if hf_quant_config:
        (tmp / "hf_quant_config.json").write_text(json.dumps(hf_quant_config, indent=2, sort_keys=True) + "\n")
    report = {"unknown_tensors": unknown, "converters": dict(sorted(reports.items())),
              "shards": n, "total_bytes": total, "plan_digest": digest}
    (tmp / REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    shas = {e["file"]: e["sha256"] for e in entries}
    manifest = {shard_name(i, n): shas[e["file"]] for i, e in enumerate(entries)}
    for p in sorted(tmp.iterdir()):
        if p.name not in manifest and p.name != JOURNAL:
            manifest[p.name] = file_sha256(p)
    (tmp / MANIFEST).write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    (tmp / JOURNAL).unlink()
    _put_in_place(tmp, dst, replace)
    return report
