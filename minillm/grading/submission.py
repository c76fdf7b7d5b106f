"""Turn a learner's notebook into the notebook that is graded.

A submission is untrusted: a check cell may have been edited, deleted, duplicated, or given more
points. With the released exercise at hand, every check is put back as it was released (source,
metadata, points) in the learner's cell, or appended at the end if the learner deleted it; copies
and check cells the release does not know are still run, but not scored.
"""

from __future__ import annotations

import copy
from pathlib import Path

from nbformat import NotebookNode

from minillm.grading.notebook import Check, checks, read


def prepare(path: Path, release: list[Check] | None) -> tuple[NotebookNode, list[Check]]:
    """The notebook to run, and its scored checks in the order they will run."""
    nb = read(path)
    known = None if release is None else {c.grade_id for c in release}
    own: dict[str, Check] = {}
    for check in checks(nb):
        if check.grade_id in own or (known is not None and check.grade_id not in known):
            check.cell.metadata["nbgrader"]["grade"] = False
        else:
            own[check.grade_id] = check
    for released in release or []:
        cell = copy.deepcopy(released.cell)
        if released.grade_id in own:
            cell["id"] = own[released.grade_id].cell.get("id", cell.get("id"))
            nb.cells[own[released.grade_id].index] = cell
        else:
            cell["id"] = f"restored-{len(nb.cells)}"
            nb.cells.append(cell)
    if nb.nbformat_minor < 5:  # cells of older notebooks carry no ids
        for cell in nb.cells:
            cell.pop("id", None)
    return nb, checks(nb)
