"""Tables for the terminal and JSON for BENCHMARKS.md, shared by every benchmark."""

from __future__ import annotations

import json
import time
from pathlib import Path

from minillm.utils.env import collect_env


def format_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """columns: (key, header) pairs; floats are shown with 2 significant decimals' worth of digits."""

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
        return str(value)

    table = [[header for _, header in columns]] + [[cell(row.get(key, "")) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = ["  ".join(text.rjust(width) for text, width in zip(line, widths)) for line in table]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def write_json(path: Path, benchmark: str, config: dict, rows: list[dict], summary: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": benchmark, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "config": config,
               "rows": rows, "summary": summary, "environment": collect_env()}
    path.write_text(json.dumps(payload, indent=2) + "\n")
