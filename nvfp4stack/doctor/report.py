"""The doctor's findings and their one-table rendering."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

ERROR, WARNING = "error", "warning"
# A table row stands for at most this many findings of one kind before they are counted instead.
SHOWN_ALIKE = 3
FOLLOW_ON_EXAMPLES = 3
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Finding:
    """One problem: which check, where (tensor / file / config key), found vs expected, and the fix.

    ``cause``: the ``where`` of the root-cause finding (a broken shard) this one follows from; ''
    for a root finding."""

    severity: str
    check: str
    where: str
    found: str
    expected: str
    fix: str
    cause: str = ""

    def line(self) -> str:
        return f"{self.where}: {self.check}: found {self.found}; expected {self.expected}. Fix: {self.fix}"


@dataclass
class DoctorReport:
    checkpoint: str
    findings: list[Finding] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # how a check ran (e.g. a kernel stand-in): no fault
    skipped: dict[str, str] = field(default_factory=dict)   # check -> why it did not run
    # tensor name -> the root-cause finding's ``where`` (its shard): later findings on it are follow-ons
    lost: dict[str, str] = field(default_factory=dict)
    # tensor group -> the scheme the recipe's plan serves it as (Scheme values); empty without a plan
    served: dict[str, str] = field(default_factory=dict)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def skip(self, check: str, reason: str) -> None:
        """A check that did not run: shown, and the result is never called clean."""
        self.skipped[check] = reason

    def add(self, severity: str, check: str, where: str, found, expected, fix: str) -> None:
        self.findings.append(Finding(severity, check, where, str(found), str(expected), fix, self.lost.get(where, "")))

    def error(self, check: str, where: str, found, expected, fix: str) -> None:
        self.add(ERROR, check, where, found, expected, fix)

    def warn(self, check: str, where: str, found, expected, fix: str) -> None:
        self.add(WARNING, check, where, found, expected, fix)

    def lose(self, names, cause: str) -> None:
        """Tensors ``names`` are unreadable because of the finding at ``cause``."""
        for n in names:
            self.lost.setdefault(n, cause)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    def checks(self, severity: str | None = None) -> set[str]:
        return {f.check for f in self.findings if severity is None or f.severity == severity}

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    def result(self) -> str:
        """The last line: FAILED, clean, or (no errors but a check did not run) which checks were skipped."""
        counts = f"({len(self.errors)} errors, {len(self.warnings)} warnings)"
        if self.errors:
            return f"result: FAILED {counts}"
        if self.skipped:
            return f"result: no errors, not clean: {len(self.skipped)} check(s) skipped ({', '.join(self.skipped)}) {counts}"
        return f"result: clean {counts}"

    def to_json(self) -> dict:
        return {"checkpoint": self.checkpoint, "ok": not self.errors, "clean": not self.errors and not self.skipped,
                "stats": self.stats, "skipped": self.skipped,
                "errors": [asdict(f) for f in self.errors], "warnings": [asdict(f) for f in self.warnings],
                "notes": self.notes}

    def table(self, widths: tuple[int, ...] = (16, 70, 160, 70, 200), full_list: str = "doctor.json") -> str:
        """One table: errors first, then warnings under their own heading (cells cut at ``widths``;
        ``full_list``, the JSON report, keeps every finding in full). Follow-on errors are one row
        under their root cause; more than SHOWN_ALIKE findings alike but for numbers are one row."""
        cols = ("check", "where", "found", "expected", "fix")

        def cut(s: str, width: int) -> str:
            return s if len(s) <= width else s[: width - 3] + "..."

        lines = [f"doctor: {self.checkpoint}",
                 "  " + ", ".join(f"{k}={v}" for k, v in self.stats.items())]
        for title, items in (("ERRORS", self.errors), ("WARNINGS", self.warnings)):
            lines.append(f"{title} ({len(items)})")
            if not items:
                continue
            rows = [[cut(v, w) for v, w in zip(r, widths)] for r in _rows(items, full_list)]
            ws = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
            lines.append("  " + " | ".join(c.ljust(w) for c, w in zip(cols, ws)))
            lines.append("  " + "-+-".join("-" * w for w in ws))
            lines += ["  " + " | ".join(v.ljust(w) for v, w in zip(r, ws)).rstrip() for r in rows]
        lines += [f"SKIPPED {check}: {reason}" for check, reason in self.skipped.items()]
        lines += [f"NOTE: {n}" for n in self.notes]
        lines.append(self.result())
        return "\n".join(lines)


def _rows(items: list[Finding], full_list: str) -> list[tuple[str, ...]]:
    """Table rows: root findings (alike ones counted), each followed by one row counting its follow-ons."""
    follow: dict[str, list[Finding]] = {}
    for f in items:
        if f.cause:
            follow.setdefault(f.cause, []).append(f)
    roots = [f for f in items if not f.cause]
    alike: dict[tuple, list[Finding]] = {}
    for f in roots:
        key = (f.check, _NUMBER.sub("N", f.where), _NUMBER.sub("N", f.found), _NUMBER.sub("N", f.expected), f.fix)
        alike.setdefault(key, []).append(f)
    rows: list[tuple[str, ...]] = []
    causes = {f.where for f in roots}
    for (check, where, _, _, fix), group in alike.items():
        first = group[0]
        if len(group) <= SHOWN_ALIKE:
            rows += [(f.check, f.where, f.found, f.expected, f.fix) for f in group]
        else:
            same = all(f.where == first.where for f in group)
            rows.append((check, f"{first.where if same else where} (x{len(group)})", f"{first.found} (at "
                         f"{first.where}; {len(group) - 1} more alike, listed in {full_list})", first.expected, fix))
        for f in group:
            rows += _follow_on_row(f.where, follow.pop(f.where, []), full_list)
    for cause, fs in follow.items():  # a cause that is no finding of this severity
        if cause not in causes:
            rows += _follow_on_row(cause, fs, full_list)
    return rows


def _follow_on_row(cause: str, fs: list[Finding], full_list: str) -> list[tuple[str, ...]]:
    if not fs:
        return []
    names = list(dict.fromkeys(f.where for f in fs))
    checks = "/".join(sorted({f.check for f in fs}))
    eg = ", ".join(names[:FOLLOW_ON_EXAMPLES]) + (", ..." if len(names) > FOLLOW_ON_EXAMPLES else "")
    return [("follow-on", f"{len(fs)} follow-on errors of {cause}",
             f"{checks} for {len(names)} tensors of {cause} (e.g. {eg})", "-",
             f"fix {cause} (the row above): these follow from it; all {len(fs)} listed in {full_list}")]
