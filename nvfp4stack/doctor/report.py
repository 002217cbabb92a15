"""The doctor's findings and their one-table rendering."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

ERROR, WARNING = "error", "warning"


@dataclass(frozen=True)
class Finding:
    """One problem: which check, where (tensor / file / config key), found vs expected, and the fix."""

    severity: str
    check: str
    where: str
    found: str
    expected: str
    fix: str

    def line(self) -> str:
        return f"{self.where}: {self.check}: found {self.found}; expected {self.expected}. Fix: {self.fix}"


@dataclass
class DoctorReport:
    checkpoint: str
    findings: list[Finding] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)   # how a check ran (e.g. a kernel stand-in): no fault

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def add(self, severity: str, check: str, where: str, found, expected, fix: str) -> None:
        self.findings.append(Finding(severity, check, where, str(found), str(expected), fix))

    def error(self, check: str, where: str, found, expected, fix: str) -> None:
        self.add(ERROR, check, where, found, expected, fix)

    def warn(self, check: str, where: str, found, expected, fix: str) -> None:
        self.add(WARNING, check, where, found, expected, fix)

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

    def to_json(self) -> dict:
        return {"checkpoint": self.checkpoint, "ok": not self.errors, "stats": self.stats,
                "errors": [asdict(f) for f in self.errors], "warnings": [asdict(f) for f in self.warnings],
                "notes": self.notes}

    def table(self, widths: tuple[int, ...] = (16, 70, 160, 70, 200)) -> str:
        """One table: errors first, then warnings under their own heading (cells cut at ``widths``;
        doctor.json keeps the full text)."""
        cols = ("check", "where", "found", "expected", "fix")

        def cut(s: str, width: int) -> str:
            return s if len(s) <= width else s[: width - 3] + "..."

        lines = [f"doctor: {self.checkpoint}",
                 "  " + ", ".join(f"{k}={v}" for k, v in self.stats.items())]
        for title, items in (("ERRORS", self.errors), ("WARNINGS", self.warnings)):
            lines.append(f"{title} ({len(items)})")
            if not items:
                continue
            rows = [[cut(getattr(f, c), w) for c, w in zip(cols, widths)] for f in items]
            ws = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
            lines.append("  " + " | ".join(c.ljust(w) for c, w in zip(cols, ws)))
            lines.append("  " + "-+-".join("-" * w for w in ws))
            lines += ["  " + " | ".join(v.ljust(w) for v, w in zip(r, ws)).rstrip() for r in rows]
        lines += [f"NOTE: {n}" for n in self.notes]
        lines.append("result: " + ("FAILED" if self.errors else "clean") +
                     f" ({len(self.errors)} errors, {len(self.warnings)} warnings)")
        return "\n".join(lines)
