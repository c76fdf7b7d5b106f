"""The exercise generator: what it hides, what it strips, that it is byte-stable, and that --check
catches every kind of drift between solutions/ and exercises/."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from minillm.course.release import colab_badge, setup_cell
from minillm.grading import exercises
from minillm.grading.notebook import checks, dumps, is_solution, read

REPO = Path(__file__).resolve().parents[2]


def solution_meta(grade_id: str) -> dict:
    return {"nbgrader": {"solution": True, "grade": False, "locked": False, "grade_id": grade_id,
                         "schema_version": 3, "task": False}}


def synthetic_solution() -> nbformat.NotebookNode:
    code = new_code_cell("import math\n\ndef f(x):\n    \"\"\"doc\"\"\"\n    ### BEGIN SOLUTION\n"
                         "    return math.sqrt(x)\n    ### END SOLUTION\n\nprint(f(4))",
                         id="code", metadata=solution_meta("f"), execution_count=3,
                         outputs=[new_output("stream", name="stdout", text="2.0\n")])
    code.metadata["execution"] = {"iopub.execute_input": "2024-01-01T00:00:00Z"}
    partial_md = new_markdown_cell("Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION\n\nThe end.",
                                   id="partial", metadata=solution_meta("why"))
    whole_md = new_markdown_cell("The whole answer.", id="whole", metadata=solution_meta("whole"))
    check = new_code_cell("assert f(4) == 2", id="check", metadata={"nbgrader": {
        "grade": True, "solution": False, "locked": True, "points": 1, "grade_id": "f_check",
        "schema_version": 3, "task": False}})
    nb = new_notebook(cells=[code, partial_md, whole_md, check])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return nb


def test_solution_regions_become_stubs_at_their_indentation():
    ex = exercises.exercise_from(synthetic_solution(), "01_f.ipynb")
    code, partial_md, whole_md, check = ex.cells
    assert code.source == ("import math\n\ndef f(x):\n    \"\"\"doc\"\"\"\n    # YOUR CODE HERE\n"
                           "    raise NotImplementedError()\n\nprint(f(4))")
    assert partial_md.source == "Why?\n\nYOUR ANSWER HERE\n\nThe end."
    assert whole_md.source == "YOUR ANSWER HERE"
    assert check.source == "assert f(4) == 2"


def test_outputs_counts_timings_and_widgets_are_stripped_and_checks_locked():
    ex = exercises.exercise_from(synthetic_solution(), "01_f.ipynb")
    assert ex.cells[0].outputs == [] and ex.cells[0].execution_count is None
    assert "execution" not in ex.cells[0].metadata
    assert "widgets" not in ex.metadata
    assert ex.cells[3].metadata["editable"] is False and ex.cells[3].metadata["deletable"] is False
    assert "editable" not in ex.cells[0].metadata
    assert ex.cells[0].metadata["nbgrader"] == solution_meta("f")["nbgrader"]


@pytest.mark.parametrize("source, metadata, error", [
    ("x = 1\n### BEGIN SOLUTION\nx = 2", solution_meta("a"), "never closed"),
    ("### END SOLUTION", solution_meta("a"), "without ### BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", solution_meta("a"), "inside a solution"),
    ("x = 1", solution_meta("a"), "no ### BEGIN SOLUTION"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", {}, "no nbgrader metadata"),
])
def test_malformed_markers_are_refused_with_the_cell_named(source, metadata, error):
    nb = new_notebook(cells=[new_markdown_cell("intro", id="intro"),
                             new_code_cell(source, id="bad", metadata=metadata)])
    with pytest.raises(exercises.MarkerError, match=f"cell 1\\b.*{error}"):
        exercises.exercise_from(nb, "01_bad.ipynb")


def test_the_exercise_has_the_course_setup_and_its_colab_badge_opens_the_exercise():
    exercise = read(REPO / "exercises" / "01_kv_cache.ipynb")
    assert exercise.cells[0].source == setup_cell()
    assert exercise.cells[1].source.split("\n")[0] == colab_badge("exercises/01_kv_cache.ipynb")


def test_repo_exercise_hides_every_solution_line():
    solution = read(REPO / "solutions" / "01_kv_cache.ipynb")
    exercise = read(REPO / "exercises" / "01_kv_cache.ipynb")
    hidden = []
    for cell in filter(is_solution, solution.cells):
        lines = cell.source.split("\n")
        begin, end = lines.index("    ### BEGIN SOLUTION"), lines.index("    ### END SOLUTION")
        hidden += [line for line in lines[begin + 1:end] if line.strip()]
    text = "\n".join(cell.source for cell in exercise.cells)
    assert hidden and not [line for line in hidden if line in text]
    assert [c.grade_id for c in checks(exercise)] == [c.grade_id for c in checks(solution)]


def test_generation_is_byte_stable_and_idempotent(tmp_path):
    shutil.copytree(REPO / "solutions", tmp_path / "solutions")
    names = sorted(p.name for p in (REPO / "solutions").glob("*.ipynb"))
    assert exercises.generate(tmp_path) == [f"wrote {tmp_path / 'exercises' / name}" for name in names]
    first = {name: (tmp_path / "exercises" / name).read_bytes() for name in names}
    assert exercises.generate(tmp_path) == []
    for name in names:
        assert (tmp_path / "exercises" / name).read_bytes() == first[name]
        assert first[name] == (REPO / "exercises" / name).read_bytes()
        assert exercises.render(REPO / "solutions" / name).encode() == first[name]


def test_solutions_are_saved_as_jupyter_saves_them():
    """Else a solution saved by JupyterLab would show a diff that no one made."""
    for path in REPO.glob("solutions/*.ipynb"):
        assert path.read_text(encoding="utf-8") == dumps(read(path)), f"{path} is not in Jupyter's form"


def test_check_passes_on_the_repo(capsys):
    assert exercises.main(["--root", str(REPO), "--check"]) == 0


def test_check_names_stale_missing_and_extra_exercises(tmp_path, capsys):
    shutil.copytree(REPO / "solutions", tmp_path / "solutions")
    shutil.copytree(REPO / "exercises", tmp_path / "exercises")
    assert exercises.main(["--root", str(tmp_path), "--check"]) == 0

    stale = tmp_path / "exercises" / "01_kv_cache.ipynb"
    nb = read(stale)
    nb.cells[0].source += "\nedited by hand"
    stale.write_text(dumps(nb), encoding="utf-8")
    shutil.copy(tmp_path / "solutions" / "01_kv_cache.ipynb", tmp_path / "solutions" / "02_new.ipynb")
    (tmp_path / "exercises" / "99_orphan.ipynb").write_text(dumps(new_notebook()), encoding="utf-8")
    capsys.readouterr()
    assert exercises.main(["--root", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"stale: {stale}" in err
    assert f"missing: {tmp_path / 'exercises' / '02_new.ipynb'}" in err
    assert f"extra: {tmp_path / 'exercises' / '99_orphan.ipynb'}" in err

    assert exercises.main(["--root", str(tmp_path)]) == 0  # regenerating repairs all three
    assert not (tmp_path / "exercises" / "99_orphan.ipynb").exists()
    assert exercises.main(["--root", str(tmp_path), "--check"]) == 0
