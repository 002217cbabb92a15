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
would reject after conversion is refused with nothing written. With ``workers`` > 1 several
shards are converted at once (``parallel``), to the same bytes and the same journal.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import time
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
from nvfp4stack.convert.parallel import plan_shards, write_shards
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


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's limit), not the host's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):   # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def resolve_workers(workers: int) -> int:
    """convert.workers: 0 (auto) -> one shard in flight per two usable cores (each keeps about one
    converting and one hashing), 1 to 8; on 2 cores a second shard only oversubscribes torch's threads
    (~25% slower)."""
    return workers or max(1, min(8, usable_cores() // 2))


@contextlib.contextmanager
def one_torch_thread():
    """Each unit's CPU ops on one thread: they are small (one expert matrix, a few MiB), and an OpenMP
    team per op costs more than it saves; the cores go to shards in flight (``workers``) instead. On a
    16-core host, one shard at a time with torch's 16 threads kept 10 cores busy for 33 s (12.8 GB)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def write_unit(writer: ShardWriter, unit: Unit, reader: ShardedReader, converters: Mapping,
               device: torch.device) -> dict | None:
    """Read, convert and add one unit's tensors to ``writer``; returns its converter's report, if any."""
    if unit.converter == PASSTHROUGH:
        for name, _ in unit.members:
            writer.add_raw(name, reader.infos[name])
        return None
    conv = converters[unit.converter]
    conv.report = None
    group = {local: reader.get(name, device) for name, local in unit.members}
    out = conv.convert(group, unit.prefix)
    del group
    for key, t in out.items():
        writer.add(join_name(unit.prefix, key), t)
    return getattr(conv, "report", None)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def convert_checkpoint(src: str | Path, dst: str | Path, choose: Chooser | Mapping[str, str] | list, *,
                       unknown_tensors: str = REFUSE, sources: Mapping[str, Scheme] | None = None,
                       overwrite: bool = False,
                       max_shard_bytes: int = 4 << 30, device: str = "auto",
                       config: dict | None = None, hf_quant_config: dict | None = None,
                       progress: bool = True, workers: int = 1) -> dict:
    """Convert checkpoint ``src`` into ``dst``; returns the report written to convert_report.json.

    choose(module) -> converter name, 'passthrough', or None (unknown: refused, or copied unchanged
    when ``unknown_tensors`` is 'keep'). A mapping or 'glob=converter' list is taken as glob rules.
    ``sources``: group -> the scheme the plan reads it as (default: each converter's source format).
    ``config`` replaces config.json (default: the source's, copied); ``hf_quant_config`` is written
    when given. Raises ConvertRefused, with nothing written, when the input fails the pre-flight.
    ``workers``: shards converted at once (1: one at a time; 0: ``resolve_workers``'s auto); the
    bytes are the same for every value (``parallel``).
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
    workers = resolve_workers(workers)

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

    def write(w: ShardWriter, unit: Unit, convs: Mapping) -> dict | None:
        return write_unit(w, unit, reader, convs, dev)

    def journal(closed: ShardWriter, next_unit: int, shard_reports: dict) -> None:
        nonlocal shard_i
        path = closed.path
        _append_journal(tmp, {"file": path.name, "size": path.stat().st_size, "sha256": closed.sha256,
                              "names": closed.names(), "next_unit": next_unit, "reports": shard_reports})
        reports.update(shard_reports)
        shard_i += 1

    t0, converted = time.perf_counter(), sum(in_bytes[start:])
    try:
        with torch.inference_mode(), one_torch_thread():  # inference_mode is per thread: each worker enters its own
            if workers > 1:
                planned = plan_shards(units, specs, start, shard_i, max_shard_bytes)
                if planned:  # the workers' bar updates are serialised by write_shards
                    start = write_shards(planned, units, tmp, max_shard_bytes, workers, write, journal,
                                         bar.update, in_bytes)
            for ui in range(start, len(units)):
                u = units[ui]
                if writer is None:
                    writer = ShardWriter(tmp / f"shard-{shard_i:05d}.safetensors",
                                         specs.shard(units, ui, max_shard_bytes))
                report = write(writer, u, converters)
                if report:
                    unit_reports[f"{u.converter}:{u.prefix}"] = report
                bar.update(in_bytes[ui])
                if writer.nbytes >= max_shard_bytes or ui == len(units) - 1:
                    writer.close()
                    journal(writer, ui + 1, unit_reports)
                    writer, unit_reports = None, {}
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        if writer is not None:
            writer.abort()
        disk_full(tmp, dst, writer.path if writer is not None else Path(e.filename or tmp), e)
    bar.close()
    seconds = time.perf_counter() - t0
    if converted:
        print(f"convert: {converted / 1e9:.2f} GB of input converted and written in {seconds:.1f} s "
              f"({converted / 1e9 / max(seconds, 1e-9):.2f} GB/s, convert.workers={workers})", flush=True)
    try:
        return finalize(dst, tmp, replace, side, unknown, reports, config, hf_quant_config, digest)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        disk_full(tmp, dst, Path(e.filename) if e.filename else tmp, e)
