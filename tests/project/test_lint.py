"""ruff over the whole project (its configuration is in pyproject.toml), and files small enough to
hold one idea each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 300  # past this, a module is usually two ideas: split it


def test_ruff_is_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout[-4000:]


def test_no_module_of_the_package_is_over_300_lines():
    paths = [path for folder in ("minillm", "widgets") for path in (ROOT / folder).rglob("*.py")]
    long = {str(path.relative_to(ROOT)): n for path in paths if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by idea (at most {MAX_LINES} lines each): {long}"


def test_notebooks_name_nothing_undefined():
    """pyflakes' checks over every chapter and solution (a notebook is read as one module, cell after
    cell), and the undefined-name checks over the exercises (whose stubs leave names unused): a typo
    in a branch that only a GPU runs, which CI's CPU never executes, still fails here."""
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--output-format", "concise"]
    chapters = subprocess.run([*ruff, "--select", "F", str(ROOT / "notebooks"), str(ROOT / "solutions")],
                              capture_output=True, text=True)
    assert chapters.returncode == 0, chapters.stdout[-4000:]
    exercises = subprocess.run([*ruff, "--select", "F821,F822,F823", str(ROOT / "exercises")], capture_output=True,
                               text=True)
    assert exercises.returncode == 0, exercises.stdout[-4000:]
