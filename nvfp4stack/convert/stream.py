"""Streaming, resumable, atomic checkpoint conversion.

One work unit (``units``: a module, or the modules a multi-module converter fuses) is read,
converted and written at a time; pass-through tensors are copied byte for byte without being
materialised. Output goes to ``.<dst>.tmp`` next to ``dst``; a shard is closed at a unit boundary
once it reaches ``max_shard_bytes``, so the layout depends only on the input and the plan. Each
shard is written once, header first (``out_specs`` plans its tensors, ``shard_writer`` writes it).
Every closed shard is recorded in the journal (with the next unit to run), so a killed run
resumes from the last complete shard and produces the same bytes as an uninterrupted one; the
index, configs, report and manifest follow (``finalize``), then the directory is renamed into
place (``destination``). The free space is checked before the first shard. Before anything is
written the input passes the doctor's header-only checks (``validate``): a checkpoint the doctor
would reject after conversion is refused with nothing written.
"""
from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path
from typing import Mapping

import torch
from tqdm import tqdm

from nvfp4stack.checkpoint.safetensors_io import ShardedReader
from nvfp4stack.checkpoint.side_files import side_files
from nvfp4stack.convert import CONVERTERS
from nvfp4stack.convert.destination import (  # noqa: F401
    MANIFEST,
    REPORT,
    ConvertRefused,
    DestinationExists,
    check_destination,
    check_free_space,
    completed_report,
    disk_full,
    estimated_out_bytes,
    output_problem,
    put_in_place,
)
from nvfp4stack.convert.finalize import finalize
from nvfp4stack.convert.journal import JOURNAL, append_journal, plan_digest, read_journal, start_journal
from nvfp4stack.convert.out_specs import OutputSpecs
from nvfp4stack.convert.shard_writer import ShardWriter
from nvfp4stack.convert.units import (  # noqa: F401
    PASSTHROUGH,
    Chooser,
    Unit,
    chooser_from_rules,
    join_name,
    parse_rules,
    plan_units,
    split_name,
    unit_sources,
)
from nvfp4stack.convert.validate import KEEP, REFUSE, input_problems
from nvfp4stack.schemes import Scheme

log = logging.getLogger(__name__)
_append_journal = append_journal  # looked up at each shard close, where tests interrupt a run


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
    digest = plan_digest(reader, units, max_shard_bytes)
    problems = input_problems(src, unit_sources(units) if sources is None else sources, unknown, unknown_tensors,
                              reader.infos)
    if problems:
        more = (f" (+{len(problems) - 1} more; 'python main.py doctor checkpoint={src}' lists every finding)"
                if len(problems) > 1 else "")
        raise ConvertRefused(f"convert.src: {src} is not a valid input, nothing was written: {problems[0]}{more}")
    side, left_behind = side_files(src)  # refuses a config/tokenizer linking out before any write
    tmp = dst.with_name(f".{dst.name}.tmp")
    replace = check_destination(dst, digest, overwrite)
    if replace is None:
        return {**completed_report(dst), "already_complete": True}
    if left_behind:
        log.warning("%s: not copied into the output (not a config, tokenizer, license or read-me file): %s",
                    src, ", ".join(left_behind))
    if unknown:  # kept (input_problems refuses them otherwise): the user asked for it
        log.warning("%d tensor(s) matched no plan rule: %s%s; copying them unchanged (convert.unknown_tensors=%s)",
                    len(unknown), ", ".join(unknown[:20]), " ..." if len(unknown) > 20 else "", KEEP)
    converters = {c: CONVERTERS.get(c)() for c in sorted({u.converter for u in units} - {PASSTHROUGH})}
    dev = resolve_device(device)

    if (tmp.is_dir() and not (tmp / JOURNAL).exists() and completed_report(tmp).get("plan_digest") == digest
            and output_problem(tmp) is None):  # killed after finalize wrote everything, before the rename
        print(f"convert: {tmp} was complete; putting it in place", flush=True)
        put_in_place(tmp, dst, replace)
        return completed_report(dst)
    done = read_journal(tmp, digest)
    if not done and tmp.exists():
        print(f"convert: discarding the stale partial output {tmp} (another plan or source, or no "
              "complete shard yet); starting over", flush=True)
        shutil.rmtree(tmp)
    elif done:
        print(f"convert: resuming after shard {len(done)} ({done[-1]['next_unit']} of {len(units)} "
              f"tensor groups done) from {tmp}", flush=True)
    tmp.mkdir(parents=True, exist_ok=True)
    start_journal(tmp, digest, done)  # drops anything after the last complete shard

    start = done[-1]["next_unit"] if done else 0
    check_free_space(tmp, dst, sum(estimated_out_bytes(reader, u) for u in units[start:])
                     + sum(p.stat().st_size for p in side), fresh=not done)
    reports: dict = {k: v for e in done for k, v in e["reports"].items()}
    in_bytes = [sum(reader.infos[n].nbytes for n, _ in u.members) for u in units]
    bar = tqdm(total=sum(in_bytes), initial=sum(in_bytes[:start]), unit="B", unit_scale=True,
               unit_divisor=1024, desc=f"convert -> {dst.name}", disable=not progress)
    specs = OutputSpecs(reader, converters, dev)
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
                    writer = ShardWriter(tmp / f"shard-{shard_i:05d}.safetensors",
                                         specs.shard(units, ui, max_shard_bytes))
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
                        writer.add(join_name(u.prefix, key), t)
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
        disk_full(tmp, dst, writer.path if writer is not None else tmp, e)
    bar.close()
    try:
        return finalize(dst, tmp, replace, side, unknown, reports, config, hf_quant_config, digest)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        disk_full(tmp, dst, Path(e.filename) if e.filename else tmp, e)
