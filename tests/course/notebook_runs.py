"""How notebooks are executed for tests: nbval on a copy whose checked cells carry the expected
outputs, which live in tests/course/notebook_outputs/ because notebooks are committed without outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = ROOT / "tests" / "course" / "notebook_outputs"
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
NOTEBOOK_ENV = {"TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "MINILLM_MODEL": "tiny",
                "MINILLM_DRAFT_MODEL": "tiny-draft", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


def runs_at_once() -> int:
    """How many notebooks a test module runs at once: one per core this pytest process has to itself
    (all of them, or one under pytest-xdist's one worker per core)."""
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def course_notebooks() -> list[Path]:
    return sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])


def chapter_notebooks() -> list[Path]:
    """The chapters. The solutions run in full once, under minillm-grade (test_grading_marks.py
    and test_grading.py), which also fails a solution any cell of which raised."""
    return sorted(ROOT.glob("notebooks/*.ipynb"))


def expected_outputs_file(notebook: Path) -> Path:
    return OUTPUTS / f"{notebook.parent.name}__{notebook.stem}.json"


def checked_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(CHECK_MARK)]


def with_expected_outputs(notebook: Path, dest: Path) -> Path:
    """A copy of the notebook in dest whose checked cells hold their recorded outputs."""
    nb = nbformat.read(notebook, as_version=4)
    expected = json.loads(expected_outputs_file(notebook).read_text()) if checked_cells(nb) else {}
    for cell in checked_cells(nb):
        if cell.id not in expected:
            raise KeyError(f"{notebook.name}: no recorded output for checked cell {cell.id!r}; "
                           "run scripts/record_notebook_outputs.py")
        cell.outputs = [nbformat.from_dict(o) for o in expected[cell.id]]
        cell.execution_count = 1  # nbval compares only cells that were run, and refuses outputs without a count
    path = dest / notebook.name
    nbformat.write(nb, path)
    return path


def run_nbval(notebook: Path, timeout: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """nbval in lax mode: every cell must run without error; only checked cells are compared. `env`
    adds to the environment the notebook runs in. The kernel's temporary files go to `scratch(notebook)`,
    beside the notebook's copy, so that what a run leaves behind can be seen there."""
    sanitize = Path(__file__).parent / "nbval_sanitize.cfg"
    scratch(notebook).mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env",
           "--nbval-sanitize-with", str(sanitize), "--rootdir", str(notebook.parent), "-o", "addopts=", str(notebook)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=notebook.parent,
                          env={**os.environ, **NOTEBOOK_ENV, "TMPDIR": str(scratch(notebook)), **(env or {})})


def scratch(notebook: Path) -> Path:
    """The temporary folder of the kernel that runs `notebook` (a copy in a test's own folder)."""
    return notebook.parent / "tmp"
