"""Streaming, resumable, atomic checkpoint conversion.

One work unit (a module, or the modules a multi-module converter fuses) is read, converted and
written at a time; pass-through tensors are copied byte for byte without being materialised.
Output goes to ``.<dst>.tmp`` next to ``dst``; a shard is closed at a unit boundary once it
reaches ``max_shard_bytes``, so the layout depends only on the input and the plan. Every closed
shard is recorded in ``journal.jsonl`` (with the next unit to run), so a killed run resumes from
the last complete shard and produces the same bytes as an uninterrupted one. The index, configs
and report follow, the manifest (sha256 per file) last, then the directory is renamed into place.
"""
from __future__ import annotations

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

from nvfp4stack.checkpoint.safetensors_io import (INDEX_NAME, ShardedReader, ShardWriter,
                                                  file_sha256, shard_name, write_index)
from nvfp4stack.convert import CONVERTERS

log = logging.getLogger(__name__)

PASSTHROUGH = "passthrough"
JOURNAL = "journal.jsonl"
MANIFEST = "manifest.json"
REPORT = "convert_report.json"
_FORMAT_VERSION = 1
Chooser = Callable[[str], "str | None"]


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
    lines = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    if not lines or lines[0].get("plan") != digest:
        return []
    done = []
    for entry in lines[1:]:
        f = tmp / entry["file"]
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
                       unknown_tensors: str = PASSTHROUGH, overwrite: bool = False,
                       max_shard_bytes: int = 4 << 30, device: str = "auto",
                       config: dict | None = None, hf_quant_config: dict | None = None,
                       progress: bool = True) -> dict:
    """Convert checkpoint ``src`` into ``dst``; returns the report written to convert_report.json.

    choose(module) -> converter name, 'passthrough', or None (unknown: handled per
    ``unknown_tensors``). A mapping or 'glob=converter' list is taken as glob rules. ``config`` replaces config.json
    (default: the source's, copied); ``hf_quant_config`` is written when given.
    """
    src, dst = Path(src), Path(dst)
    if not callable(choose):
        choose = chooser_from_rules(choose)
    reader = ShardedReader(src)
    units, unknown = plan_units(reader.names(), choose)
    digest = _plan_digest(reader, units, max_shard_bytes)
    if dst.exists() and not overwrite:
        done_report = _completed_report(dst)
        if done_report.get("plan_digest") == digest:
            print(f"convert: {dst} is already complete for this plan; nothing to do "
                  "(convert.overwrite=true rebuilds it)", flush=True)
            return done_report
        raise FileExistsError(f"convert.dst: {dst} already exists and was converted with another plan or "
                              "source; set convert.overwrite=true to replace it, or choose another convert.dst")
    if unknown:
        msg = (f"{len(unknown)} tensor(s) matched no plan rule: {', '.join(unknown[:20])}"
               f"{' ...' if len(unknown) > 20 else ''}")
        if unknown_tensors == "error":
            raise ValueError(f"{msg}. Add rules for them, or set convert.unknown_tensors=passthrough")
        log.warning("%s; copying them unchanged (convert.unknown_tensors=passthrough)", msg)
    converters = {c: CONVERTERS.get(c)() for c in sorted({u.converter for u in units} - {PASSTHROUGH})}
    dev = resolve_device(device)

    tmp = dst.with_name(f".{dst.name}.tmp")
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
    bar.close()
    return _finalize(src, dst, tmp, overwrite, unknown, reports, config, hf_quant_config, digest)


def _completed_report(dst: Path) -> dict:
    try:
        return json.loads((dst / REPORT).read_text())
    except (OSError, ValueError):
        return {}


def _finalize(src: Path, dst: Path, tmp: Path, overwrite: bool, unknown: list[str],
              reports: dict, config: dict | None, hf_quant_config: dict | None, digest: str) -> dict:
    entries = [json.loads(l) for l in (tmp / JOURNAL).read_text().splitlines()[1:]]
    n = len(entries)
    weight_map, total = {}, 0
    for i, e in enumerate(entries):
        final = shard_name(i, n)
        os.replace(tmp / e["file"], tmp / final)
        weight_map.update({name: final for name in e["names"]})
        total += e["size"]
    write_index(tmp, weight_map, total)
    # tokenizer and other side files travel with the weights
    for p in sorted(src.iterdir()):
        if p.is_file() and not p.name.endswith(".safetensors") and p.name not in (INDEX_NAME, "config.json", MANIFEST):
            shutil.copy2(p, tmp / p.name)
    if config is not None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    elif (src / "config.json").exists():
        shutil.copy2(src / "config.json", tmp / "config.json")
    if hf_quant_config:
        (tmp / "hf_quant_config.json").write_text(json.dumps(hf_quant_config, indent=2, sort_keys=True) + "\n")
    report = {"unknown_tensors": unknown, "converters": dict(sorted(reports.items())),
              "shards": n, "total_bytes": total, "plan_digest": digest}
    (tmp / REPORT).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (tmp / JOURNAL).unlink()
    shas = {e["file"]: e["sha256"] for e in entries}
    manifest = {shard_name(i, n): shas[e["file"]] for i, e in enumerate(entries)}
    for p in sorted(tmp.iterdir()):
        if p.name not in manifest:
            manifest[p.name] = file_sha256(p)
    (tmp / MANIFEST).write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n")
    if dst.exists():
        if not overwrite:
            raise FileExistsError(f"convert.dst: {dst} appeared during the run; set convert.overwrite=true")
        old = dst.with_name(f".{dst.name}.old")
        os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old)
    else:
        os.replace(tmp, dst)
    return report
