"""Several shards of a convert in flight at once (``convert.workers`` > 1), byte-identical to one at a time.

One shard at a time keeps about one core converting and one hashing (sha256 runs near 2 GB/s per
core), whatever the host. Here the shard boundaries are planned ahead from every unit's output
specs (``out_specs``) with the stream's own closing rule, and each shard is converted and written
by a thread of its own (torch ops, sha256 and pwrite release the GIL) with its own converter
instances (``conv.report`` is per-call state). Each thread holds one unit at a time. Shards are
journaled strictly in order, so a resume sees the same journal as after a sequential run.

A shard whose real output would have closed at another unit than planned (a converter whose
output depends on its data) is discarded with every later one, and the stream goes on one shard
at a time from its first unit; a shard holding a unit whose specs are unknown is never planned.
"""
from __future__ import annotations

import errno
import logging
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from nvfp4stack.convert.base import CONVERTERS
from nvfp4stack.convert.out_specs import OutputSpecs
from nvfp4stack.convert.shard_writer import ShardWriter, TensorSpec
from nvfp4stack.convert.units import Unit

log = logging.getLogger(__name__)

# write_unit(writer, unit, converters) -> the converter's report or None
WriteUnit = Callable[[ShardWriter, Unit, dict], "dict | None"]
# journal(closed writer, next unit, reports of its units)
Journal = Callable[[ShardWriter, int, dict], None]


@dataclass
class PlannedShard:
    """Shard number ``index`` holds units[first:end]; ``specs`` is its header plan."""

    index: int
    first: int
    end: int
    specs: list[TensorSpec]


def plan_shards(units: list[Unit], specs: OutputSpecs, start: int, first_index: int,
                max_shard_bytes: int) -> list[PlannedShard]:
    """The shards from ``units[start]`` on, each opening at a unit and taking units until its planned
    bytes reach ``max_shard_bytes`` (the stream's rule); stops before the first shard that holds a
    unit whose output specs are unknown."""
    out: list[PlannedShard] = []
    a = start
    while a < len(units):
        shard_specs, b, known = specs.span(units, a, max_shard_bytes)
        if not known:
            return out
        out.append(PlannedShard(first_index + len(out), a, b, shard_specs))
        a = b
    return out


class _OwnConverters(dict):
    """One shard's converter instances, made on first use: no two threads share one."""

    def __missing__(self, name: str):
        conv = self[name] = CONVERTERS.get(name)()
        return conv


class _Discarded(Exception):
    """A shard stopped because an earlier one failed or missed its plan; nothing of it is kept."""


class _ShardRuns:
    """The shared state of one parallel run: the stop line, progress, bytes counted per shard."""

    def __init__(self, shards: list[PlannedShard], units: list[Unit], tmp: Path, max_shard_bytes: int,
                 write_unit: WriteUnit, advance: Callable[[int], None], in_bytes: list[int]):
        self.shards, self.units, self.tmp, self.max = shards, units, tmp, max_shard_bytes
        self.write_unit, self._advance, self.in_bytes = write_unit, advance, in_bytes
        self.stop_from = len(shards)  # shards at or after this position stop and keep nothing
        self.counted = [0] * len(shards)
        self._lock = threading.Lock()

    def advance(self, pos: int, n: int) -> None:
        with self._lock:  # also serialises the progress bar's updates across workers
            self.counted[pos] += n
            self._advance(n)

    def stop(self, pos: int) -> None:
        self.stop_from = min(self.stop_from, pos)

    def uncount(self, pos: int) -> None:
        """Take the discarded shards' input bytes back off the progress bar."""
        with self._lock:
            n = sum(self.counted[pos:])
            self.counted[pos:] = [0] * (len(self.counted) - pos)
            self._advance(-n)

    def path(self, pos: int) -> Path:
        return self.tmp / f"shard-{self.shards[pos].index:05d}.safetensors"

    def run(self, pos: int) -> tuple[ShardWriter, dict] | None:
        """Convert and write shard ``pos``; (closed writer, reports), or None when its real bytes
        would have closed it at another unit than planned (written nothing)."""
        shard = self.shards[pos]
        if pos >= self.stop_from:
            raise _Discarded
        writer = ShardWriter(self.path(pos), shard.specs)
        reports: dict = {}
        try:
            with torch.inference_mode():  # thread-local: each worker enters its own
                converters = _OwnConverters()
                for ui in range(shard.first, shard.end):
                    if pos >= self.stop_from:
                        raise _Discarded
                    u = self.units[ui]
                    report = self.write_unit(writer, u, converters)
                    if report:
                        reports[f"{u.converter}:{u.prefix}"] = report
                    self.advance(pos, self.in_bytes[ui])
                    full, last = writer.nbytes >= self.max, ui == shard.end - 1
                    if full != last and not (last and shard.end == len(self.units)):
                        log.warning("convert: shard %d holds %d bytes after unit %d, planned to close after unit "
                                    "%d (a converter's output differs from its specs); going on one shard at a "
                                    "time from unit %d", shard.index, writer.nbytes, ui + 1, shard.end, shard.first)
                        writer.abort()
                        return None
            writer.close()
        except BaseException as e:
            writer.abort()
            if isinstance(e, OSError) and e.errno == errno.ENOSPC and not e.filename:
                e.filename = str(writer.path)  # the stream's disk_full names the shard being written
            raise
        return writer, reports


def write_shards(shards: list[PlannedShard], units: list[Unit], tmp: Path, max_shard_bytes: int, workers: int,
                 write_unit: WriteUnit, journal: Journal, advance: Callable[[int], None],
                 in_bytes: list[int]) -> int:
    """Write ``shards`` with ``workers`` threads, journaling each in order as soon as every earlier
    one is journaled. Returns the unit the stream goes on from, one shard at a time: the end of the
    last shard, or the first unit of the first one that missed its plan (it and every later one
    removed, none journaled).

    On any error every open writer is aborted (no ``.partial`` left) and the first error is raised;
    journaled shards stay for a resume, shards closed but not journaled are removed by its start.
    """
    runs = _ShardRuns(shards, units, tmp, max_shard_bytes, write_unit, advance, in_bytes)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="convert-shard")
    futures: list[Future] = [pool.submit(runs.run, pos) for pos in range(len(shards))]
    position = {f: pos for pos, f in enumerate(futures)}
    pending, nxt, missed = set(futures), 0, None
    written: dict[int, tuple[ShardWriter, dict] | None] = {}  # only what wait() reported: no race with .done()
    try:
        while nxt < len(shards) and missed is None:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for pos in sorted(position[f] for f in finished):
                e = futures[pos].exception()
                if e is None:
                    written[pos] = futures[pos].result()
                    if written[pos] is None:
                        runs.stop(pos)
                elif pos < runs.stop_from and not isinstance(e, _Discarded):
                    raise e
            while nxt < runs.stop_from and nxt in written:
                writer, reports = written.pop(nxt)
                journal(writer, shards[nxt].end, reports)
                nxt += 1
            if nxt == runs.stop_from < len(shards):
                missed = nxt
    except BaseException:
        runs.stop(0)
        raise
    finally:
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)  # each running shard sees the stop line, aborts its writer and returns
    if missed is None:
        return shards[-1].end
    runs.uncount(missed)
    for pos in range(missed, len(shards)):
        runs.path(pos).unlink(missing_ok=True)  # closed but discarded: the stream writes it again
    return shards[missed].first
