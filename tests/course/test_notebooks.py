"""Every chapter runs on the CPU under nbval, within its time budget, and its checked cells print
exactly what was recorded. (The solutions have no checked cells; they run under the grader.)

Each kernel computes on one thread: it spends much of its time in Python, on one core. The chapters
run as many at a time as this pytest process has cores to itself (one under `make test`, whose other
worker keeps CI's second core busy), the longest first; each chapter's budget counts from its own
start, beside whatever runs on the other core."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from notebook_runs import chapter_notebooks, run_nbval, runs_at_once, scratch, with_expected_outputs

from minillm.course.run_time import RUN_TIMES

BUDGET_SECONDS = 120  # per notebook, on one of a 2-core CPU's cores


def _timed_run(notebook: Path, dest: Path) -> tuple[subprocess.CompletedProcess, float, list[str]]:
    """nbval's result, the seconds it took and what the kernel left in its temporary folder."""
    copy = with_expected_outputs(notebook, dest)
    start = time.perf_counter()
    result = run_nbval(copy, timeout=3 * BUDGET_SECONDS, env={"OMP_NUM_THREADS": "1"})
    # torch's compile cache is shared by every run, not left by this one.
    left = sorted(p.name for p in scratch(copy).iterdir() if not p.name.startswith("torchinductor_"))
    return result, time.perf_counter() - start, left


def _chapter_seconds(notebook: Path) -> int:
    return RUN_TIMES[int(notebook.name[:2])].cpu_seconds


@pytest.fixture(scope="module")
def nbval_runs(request, tmp_path_factory) -> Iterator[dict[Path, Future]]:
    """The selected chapters' runs, started as the module begins, longest first."""
    selected = [item.callspec.params["notebook"] for item in request.session.items
                if item.originalname == "test_notebook_runs_under_nbval"]
    pool = ThreadPoolExecutor(max_workers=runs_at_once())
    runs = {nb: pool.submit(_timed_run, nb, tmp_path_factory.mktemp(nb.stem))
            for nb in sorted(selected, key=_chapter_seconds, reverse=True)}
    yield runs
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("notebook", chapter_notebooks(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_runs_under_nbval(notebook, nbval_runs):
    result, elapsed, left = nbval_runs[notebook].result()
    assert result.returncode == 0, f"nbval failed on {notebook.name}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert elapsed < BUDGET_SECONDS, f"{notebook.name} took {elapsed:.0f}s (budget {BUDGET_SECONDS}s)"
    # A learner runs a chapter many times: a model written to /tmp on every run filled CI's disk.
    assert not left, f"{notebook.name} left temporary files behind when its kernel stopped: {left}"
