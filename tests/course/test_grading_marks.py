"""Every exercise but exercise 01, graded by minillm-grade: its solution gets full marks and the
untouched exercise zero, each check failing because it is not implemented yet. (Exercise 01 has
its own, more detailed grading tests in test_grading.py.)

Each submission's kernel computes on one thread; as many chapters are graded at once as this pytest
process has cores to itself (see test_notebooks.py), the chapters that take longest first."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from notebook_runs import runs_at_once
from test_grading import assert_full_marks_and_zero, grade_pair_in_child

from minillm.course.run_time import RUN_TIMES

REPO = Path(__file__).resolve().parents[2]
POINTS = {"00_welcome": 7, "02_paged_kv_cache": 12, "03_triton_attention": 10, "04_continuous_batching": 10,
          "05_speculative_decoding": 7, "06_quantization": 6, "07_serving": 8, "08_the_engine_on_a_gpu": 10,
          "09_your_engine": 7}


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """The selected chapters' grading, started as the module begins."""
    selected = [item.callspec.params["name"] for item in request.session.items
                if item.originalname == "test_the_solution_gets_full_marks_and_the_exercise_zero"]
    pool = ThreadPoolExecutor(max_workers=runs_at_once())
    runs = {name: pool.submit(grade_pair_in_child, tmp_path_factory.mktemp(f"grade-{name}"),
                              REPO / "solutions" / f"{name}.ipynb", REPO / "exercises" / f"{name}.ipynb")
            for name in sorted(selected, key=lambda name: RUN_TIMES[int(name[:2])].cpu_seconds, reverse=True)}
    yield runs
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", POINTS)
def test_the_solution_gets_full_marks_and_the_exercise_zero(name, graded):
    assert_full_marks_and_zero(graded[name].result(), REPO / "exercises" / f"{name}.ipynb", POINTS[name])


def test_every_exercise_is_graded_here_or_in_test_grading():
    names = {p.stem for p in (REPO / "exercises").glob("*.ipynb")}
    assert names == {"01_kv_cache", *POINTS}
