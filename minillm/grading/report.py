"""Grades as rows: one per (submission, check), written as CSV and summed up per submission."""

from __future__ import annotations

import csv
from dataclasses import astuple, dataclass, fields
from typing import IO


@dataclass(frozen=True)
class Row:
    submission: str
    check_id: str
    passed: bool
    points_earned: float
    points_possible: float
    message: str  # the check's error, "timeout after Ns", or "not run: why"; empty when passed


def write_csv(rows: list[Row], out: IO[str]) -> None:
    writer = csv.writer(out)
    writer.writerow([f.name for f in fields(Row)])
    for row in rows:
        writer.writerow([_cell(value) for value in astuple(row)])


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def summary(rows: list[Row]) -> str:
    """One line per submission: points, checks passed, and its first problem if any, whole: a message of
    several lines continues on lines of its own, under the column."""
    by_submission: dict[str, list[Row]] = {}
    for row in rows:
        by_submission.setdefault(row.submission, []).append(row)
    width = max([len("submission"), *map(len, by_submission)])
    lines = [f"{'submission':<{width}}  {'points':>9}  {'checks':>7}  first problem"]
    indent = " " * (width + 2 + 9 + 2 + 7 + 2)
    for name, group in by_submission.items():
        earned = sum(r.points_earned for r in group)
        possible = sum(r.points_possible for r in group)
        passed = sum(r.passed for r in group)
        failed = next((r for r in group if not r.passed), None)
        problem = f"{failed.check_id}: {failed.message}".rstrip().splitlines() if failed else [""]
        lines.append(f"{name:<{width}}  {f'{earned:g} / {possible:g}':>9}  {f'{passed} / {len(group)}':>7}  "
                     f"{problem[0]}".rstrip())
        lines += [indent + line for line in problem[1:]]
    return "\n".join(lines)
