"""convert's pre-flight: the doctor's header-only checks, run on the input before the first shard.

What the doctor would reject in the output starts as a defect of the input (a missing or
mistyped tensor, a header whose shape disagrees with its bytes, a config.json that disagrees
with the shards, a group stored in another format than the plan converts from, a tensor no rule
names), so convert refuses it up front instead of writing a checkpoint the doctor rejects.
Headers only: no tensor data is read, so this stays cheap on a 150 GB checkpoint.
"""
from __future__ import annotations

import json
import os
from bisect import bisect_left
from pathlib import Path
from typing import Mapping

from nvfp4stack.checkpoint.safetensors_io import TensorInfo, check_inside
from nvfp4stack.doctor.files import by_group, read_checkpoint, sniff
from nvfp4stack.doctor.plan import stored_format
from nvfp4stack.doctor.report import DoctorReport, Finding
from nvfp4stack.families.registry import family_for_config
from nvfp4stack.schemes import Scheme

KEEP, REFUSE = "keep", "refuse"
UNKNOWN_POLICIES = (KEEP, REFUSE)
# Findings on the input's config.json fields say nothing about the output: convert writes its own
# (the family's fix-ups for the plan), and the doctor checks that one on the result. A config.json
# too incomplete for the family to derive its tensors leaves the structure unchecked here (as
# with no family); its expert count against the shards is still checked ("experts").
_CONFIG_FIELDS = "config"
# Root causes first: a broken file or a config.json that disagrees with the shards explains the
# missing and extra tensors that follow from it.
_ORDER = ("header", "truncated", "duplicate", "index", "files", "json", "experts", "layout", "source",
          "unknown", "format", "missing", "dtype", "shape", "extra")


def input_problems(src: Path, sources: Mapping[str, Scheme], unknown: list[str], unknown_tensors: str,
                   indexed: Mapping[str, TensorInfo] | None = None) -> list[str]:
    """Every problem of checkpoint ``src`` that its converted output would inherit, one line each
    (tensor, shard, found, expected, fix), root causes first; [] when it may be converted.

    ``sources``: group -> the scheme the plan (or a rule's converter) reads it as. ``unknown``:
    tensors no plan rule names, refused unless ``unknown_tensors`` is 'keep'. ``indexed``: where the
    index puts each tensor, to name the shard of one whose header entry is unreadable."""
    report = DoctorReport(str(src))
    tensors = read_checkpoint(src, report)
    cfg = _source_config(src, report)
    family = _family(cfg)
    if family is not None and tensors:
        family.check_checkpoint(cfg, tensors, report)
    _check_sources(tensors, sources, report)
    kept = set(unknown) if unknown_tensors == KEEP else set()
    if unknown and not kept:
        _refuse_unknown(unknown, tensors, report)
    findings = [f for f in report.errors if not f.cause  # a follow-on of a broken shard: its root says it
                and f.check != _CONFIG_FIELDS
                and not (f.check == "extra" and f.where in kept)]
    findings.sort(key=lambda f: _ORDER.index(f.check) if f.check in _ORDER else len(_ORDER))
    groups, known = by_group(tensors), {**(indexed or {}), **tensors}
    names = sorted(known)
    return [_line(f, known, groups, names) for f in findings]


def _source_config(src: Path, report: DoctorReport) -> dict | None:
    path = src / "config.json"
    if not path.exists():
        return None
    try:
        cfg = json.loads(check_inside(src, path, "config.json").read_text())
    except ValueError as e:
        report.error("json", "config.json", f"invalid JSON ({e})", "valid JSON", "fix or re-copy config.json")
        return None
    return cfg if isinstance(cfg, dict) else None


def _family(cfg: dict | None):
    try:
        return family_for_config(cfg) if cfg else None
    except ValueError:
        return None  # no registered family: the file-level checks still run


def _check_sources(tensors: dict[str, TensorInfo], sources: Mapping[str, Scheme], report: DoctorReport) -> None:
    """A group stored in another format than the one its converter (or pass-through) reads."""
    stored = by_group(tensors)
    for group, want in sources.items():
        found = sniff(stored.get(group, {}))
        if found is None or stored_format(found) is stored_format(want):
            continue
        report.error("source", group, f"stored as {found.value} ({stored[group]['weight'].dtype} weight)",
                     f"{want.value}, the format the plan converts this group from",
                     f"set model.source_format to what the checkpoint holds (or convert.rules), or point "
                     f"convert.src at a checkpoint whose {group} is stored as {want.value}")


def _refuse_unknown(unknown: list[str], tensors: dict[str, TensorInfo], report: DoctorReport) -> None:
    more = f" (+{len(unknown) - 1} more: {', '.join(unknown[1:4])}{' ...' if len(unknown) > 4 else ''})" \
        if len(unknown) > 1 else ""
    info = tensors.get(unknown[0])
    found = f"{info.dtype} {list(info.shape)}{more}" if info else f"a tensor no rule names{more}"
    report.error("unknown", unknown[0], found, "only tensors the plan (or convert.rules) names",
                 "remove it from the source, add a rule for it, or set convert.unknown_tensors=keep to copy "
                 "it unchanged")


def _line(f: Finding, tensors: dict[str, TensorInfo], groups: dict[str, dict[str, TensorInfo]],
          names: list[str]) -> str:
    """The finding as one line, with the shard that holds its tensor (or group); a missing tensor
    names the shard holding its nearest neighbour by name, where it would have been."""
    where = f.where
    info = tensors.get(where) or next(iter(groups.get(where, {}).values()), None)
    if info is not None:
        where = f"{where} (in {info.file.name})"
    elif f.check == "missing" and names:
        i = bisect_left(names, where)
        near = max(names[max(i - 1, 0):i + 1], key=lambda n: len(os.path.commonprefix([n, where])))
        where = f"{where} (absent from every shard; {near} is in {tensors[near].file.name})"
    return f"{where}: {f.check}: found {f.found}; expected {f.expected}. Fix: {f.fix}"
