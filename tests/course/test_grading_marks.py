"""Every exercise but exercise 01, graded by minillm-grade: its solution gets full marks and the
untouched exercise zero, each check failing because it is not implemented yet. (Exercise 01 has
its own, more detailed grading tests in test_grading.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_grading import assert_full_marks_and_zero, grade_pair

REPO = Path(__file__).resolve().parents[2]
POINTS = {"00_welcome": 7, "02_paged_kv_cache": 12, "03_triton_attention": 10, "04_continuous_batching": 10,
          "05_speculative_decoding": 7, "06_quantization": 6, "07_serving": 8, "08_the_engine_on_a_gpu": 10}


@pytest.mark.slow
@pytest.mark.parametrize("name", POINTS)
def test_the_solution_gets_full_marks_and_the_exercise_zero(name, tmp_path_factory):
    exercise = REPO / "exercises" / f"{name}.ipynb"
    graded = grade_pair(tmp_path_factory, REPO / "solutions" / f"{name}.ipynb", exercise)
    assert_full_marks_and_zero(graded, exercise, POINTS[name])


def test_every_exercise_is_graded_here_or_in_test_grading():
    names = {p.stem for p in (REPO / "exercises").glob("*.ipynb")}
    assert names == {"01_kv_cache", *POINTS}
