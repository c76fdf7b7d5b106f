"""Every chapter runs on the CPU under nbval, within its time budget, and its checked cells print
exactly what was recorded. (The solutions have no checked cells; they run under the grader.)"""

from __future__ import annotations

import time

import pytest
from notebook_runs import chapter_notebooks, run_nbval, with_expected_outputs

BUDGET_SECONDS = 120  # per notebook, on a 2-core CPU


@pytest.mark.slow
@pytest.mark.parametrize("notebook", chapter_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_runs_under_nbval(notebook, tmp_path):
    copy = with_expected_outputs(notebook, tmp_path)
    start = time.perf_counter()
    result = run_nbval(copy, timeout=3 * BUDGET_SECONDS)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, f"nbval failed on {notebook.name}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert elapsed < BUDGET_SECONDS, f"{notebook.name} took {elapsed:.0f}s (budget {BUDGET_SECONDS}s)"
