"""Repeated rounds of a benchmark: the order settings are measured in, and what a cell of rounds says.

A setting measured once per load cannot decide a 20% question (the same server moved 29-34% between
two runs, issue #35). Each setting is measured in several rounds, the settings interleaved inside a
round (ours, baseline, ours, ...) and every other round walked backwards, so a drift of the host
(clocks, heat, a neighbour) lands on every setting alike instead of on whichever ran last. A cell
is the median of its rounds with their min-max; a ratio whose two ranges overlap is "within noise".
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence, TypeVar

T = TypeVar("T")


def interleave(names: Sequence[T], baselines: Sequence[T]) -> list[T]:
    """``names`` reordered so ours and baselines alternate (each kept in its given order); the longer
    side's rest at the end: [ours1, ours2, marlin, bf16] -> [ours1, marlin, ours2, bf16]."""
    ours = [n for n in names if n not in baselines]
    bases = [n for n in names if n in baselines]
    out: list[T] = []
    for i in range(max(len(ours), len(bases))):
        out += ours[i:i + 1] + bases[i:i + 1]
    return out


def schedule(names: Sequence[T], baselines: Sequence[T], rounds: int) -> list[tuple[int, T]]:
    """(round, setting) in measuring order: interleaved, and every odd round backwards (ABBA)."""
    order = interleave(names, baselines)
    return [(r, n) for r in range(rounds) for n in (order if r % 2 == 0 else order[::-1])]


@dataclass(frozen=True)
class Cell:
    """One metric of one setting over its rounds."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / median: the fraction the repeats moved (issue #35's goal: <= 0.05)."""
        return (self.hi - self.lo) / self.median if self.median else float("inf")

    def overlaps(self, other: "Cell") -> bool:
        return self.lo <= other.hi and other.lo <= self.hi

    def text(self) -> str:
        """'21,112 [20,900-21,500] 2.8%' (one round: the value alone)."""
        if len(self.values) == 1:
            return _num(self.values[0])
        return f"{_num(self.median)} [{_num(self.lo)}-{_num(self.hi)}] {self.spread:.1%}"

    def to_dict(self) -> dict:
        return {"median": self.median, "min": self.lo, "max": self.hi, "spread": self.spread,
                "rounds": list(self.values)}


def _num(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def speedup(metric: str, ours: float, base: float) -> float:
    """Above 1 = ours faster: a throughput over the baseline's, or the baseline's latency over ours."""
    return base / ours if metric.endswith((" ms", " s")) else ours / base


def ratio_text(metric: str, ours: Cell, base: Cell) -> str:
    """The speed-up of the medians; 'within noise (x)' where the two ranges overlap (with more than
    one round on each side: a single round has no range to judge noise by)."""
    r = speedup(metric, ours.median, base.median)
    noisy = len(ours.values) > 1 and len(base.values) > 1 and ours.overlaps(base)
    return f"within noise ({r:.2f})" if noisy else f"{r:.2f}"


def worst_spread(cells: dict[str, Cell]) -> tuple[str, Cell] | None:
    """The metric whose rounds moved most (only cells of more than one round)."""
    many = [(m, c) for m, c in cells.items() if len(c.values) > 1]
    return max(many, key=lambda mc: mc[1].spread) if many else None
