"""What the course's notebooks mean to the tools: nbgrader's solution markers and cell metadata.

A cell's `metadata.nbgrader` follows nbgrader's schema (version 3): `solution: true` marks a cell
the learner fills in; `grade: true, solution: false` marks an autograded check cell worth `points`,
named by `grade_id`. Using nbgrader's names means the same notebooks work with nbgrader itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"


@dataclass(frozen=True)
class Check:
    grade_id: str
    points: float
    index: int  # position in the notebook's cells
    cell: NotebookNode


def nbgrader(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_solution(cell: NotebookNode) -> bool:
    return bool(nbgrader(cell).get("solution"))


def checks(nb: NotebookNode) -> list[Check]:
    """Autograded check cells, in notebook order."""
    found = []
    for index, cell in enumerate(nb.cells):
        meta = nbgrader(cell)
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            found.append(Check(meta["grade_id"], float(meta.get("points", 0)), index, cell))
    return found


def read(path: Path) -> NotebookNode:
    return nbformat.read(path, as_version=4)


def dumps(nb: NotebookNode) -> str:
    """Jupyter's own on-disk form (sorted keys, one-space indent, trailing newline), so that a
    notebook written here and one saved by JupyterLab diff cleanly."""
    return nbformat.writes(nb) + "\n"


def write(nb: NotebookNode, path: Path) -> None:
    path.write_bytes(dumps(nb).encode("utf-8"))
