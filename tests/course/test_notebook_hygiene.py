"""Notebooks are committed clean and their checked outputs are recorded (their setup cell and badge:
tests/course/test_release.py)."""

from __future__ import annotations

import json
import re

import nbformat
import pytest
from notebook_runs import ROOT, checked_cells, course_notebooks, expected_outputs_file

ALL_NOTEBOOKS = sorted(p for folder in ("notebooks", "solutions", "exercises") for p in (ROOT / folder).glob("*.ipynb"))
ids = lambda p: f"{p.parent.name}/{p.name}"  # noqa: E731


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=ids)
def test_committed_without_outputs_or_widget_state(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert "widgets" not in nb.metadata, f"{path.name}: remove metadata.widgets"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: clear outputs of cell {cell.id}"
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), "notebooks are named NN_topic.ipynb"


@pytest.mark.parametrize("path", course_notebooks(), ids=ids)
def test_checked_outputs_are_recorded_and_none_are_stale(path):
    checked = {c.id for c in checked_cells(nbformat.read(path, as_version=4))}
    recorded_file = expected_outputs_file(path)
    recorded = set(json.loads(recorded_file.read_text())) if recorded_file.is_file() else set()
    assert checked == recorded, (f"{path.name}: checked cells {sorted(checked)} but recorded {sorted(recorded)}; "
                                 "run scripts/record_notebook_outputs.py")
