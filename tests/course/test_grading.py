"""Checks and autograder: each check passes the solution and fails plausible wrong answers with a
message that names the mistake; the grader gives the solution full marks, the untouched exercise
zero, restores tampered checks, and survives a submission that hangs or kills its kernel."""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

from minillm import LLM
from minillm.grading import checks_kv_cache as checks
from minillm.grading import grade
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import checks as check_cells
from minillm.grading.notebook import is_solution, read, write
from minillm.grading.report import Row, summary
from minillm.grading.submission import prepare

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "01_kv_cache.ipynb"
EXERCISE = REPO / "exercises" / "01_kv_cache.ipynb"


@pytest.fixture(scope="module")
def solution() -> dict:
    """The solution notebook's own functions, run in a namespace (no kernel needed)."""
    namespace: dict = {"torch": torch}
    for cell in filter(is_solution, read(SOLUTION).cells):
        exec(cell.source, namespace)
    return namespace


def test_checks_pass_on_the_solution(solution, capsys):
    checks.check_append_kv(solution["append_kv"])
    checks.check_attend(solution["attend"])
    checks.check_attend_gqa(solution["attend"])
    checks.check_append_and_attend(solution["append_and_attend"])
    assert capsys.readouterr().out.count(" passed: ") == 4


# Wrong answers a learner plausibly writes, each with what its check must say about it.

def forgets_v(s):
    def append_kv(k_cache, v_cache, k, v, start):
        k_cache[start:start + len(k)] = k
        return start + len(k)
    return append_kv


def writes_one_row_late(s):
    def append_kv(k_cache, v_cache, k, v, start):
        k_cache[start + 1:start + 1 + len(k)] = k
        v_cache[start + 1:start + 1 + len(k)] = v
        return start + len(k)
    return append_kv


def ignores_start(s):
    def append_kv(k_cache, v_cache, k, v, start):
        k_cache[:len(k)] = k
        v_cache[:len(k)] = v
        return start + len(k)
    return append_kv


def returns_last_index(s):
    return lambda k_cache, v_cache, k, v, start: s["append_kv"](k_cache, v_cache, k, v, start) - 1


def rebinds_instead_of_writing(s):
    def append_kv(k_cache, v_cache, k, v, start):
        k_cache = torch.cat([k_cache[:start], k])
        v_cache = torch.cat([v_cache[:start], v])
        return len(k_cache)
    return append_kv


def explicit_attention(mask: str = "causal", scale: bool = True, head_of=lambda h, g, kv: h // g,
                       softmax_dim: int = -1):
    """Attention written out, with one knob per mistake."""
    def attend(q, k, v, q_start):
        n, heads, d = q.shape
        group = heads // k.shape[1]
        kv_head = head_of(torch.arange(heads), group, k.shape[1])
        scores = torch.einsum("nhd,lhd->hnl", q, k[:, kv_head]) / (math.sqrt(d) if scale else 1)
        q_pos = torch.arange(n) + {"causal": q_start, "from_zero": 0, "strict": q_start - 1}.get(mask, 0)
        if mask != "none":
            scores = scores.masked_fill(torch.arange(k.shape[0]) > q_pos[:, None], float("-inf"))
        return torch.einsum("hnl,lhd->nhd", scores.softmax(softmax_dim), v[:, kv_head])
    return attend


def cache_attention(attend, over: str = "end", q_start_zero: bool = False, append: bool = True):
    def append_and_attend(q, k, v, k_cache, v_cache, start):
        end = start + len(k)
        if append:
            k_cache[start:end] = k
            v_cache[start:end] = v
        if over == "new":
            return attend(q, k, v, 0)
        rows = {"end": slice(0, end), "before_end": slice(0, end - 1), "all": slice(None)}[over]
        return attend(q, k_cache[rows], v_cache[rows], 0 if q_start_zero else start)
    return append_and_attend


WRONG_ANSWERS = [
    ("check_append_kv", forgets_v, "v_cache was not written at all"),
    ("check_append_kv", rebinds_instead_of_writing, "k_cache was not written at all.*in place"),
    ("check_append_kv", writes_one_row_late, r"landed at rows 1\.\.5, off by \+1"),
    ("check_append_kv", ignores_start, r"one decode step.*landed at rows 0\.\.0, off by -5"),
    ("check_append_kv", returns_last_index, "returned 4; expected end = start \\+ n = 5"),
    ("check_attend", lambda s: explicit_attention(mask="none"), "there is no causal mask"),
    ("check_attend", lambda s: explicit_attention(mask="from_zero"), "mask ignores q_start"),
    ("check_attend", lambda s: explicit_attention(mask="strict"), "must see its own key"),
    ("check_attend", lambda s: explicit_attention(scale=False), "not scaled by 1/sqrt"),
    ("check_attend", lambda s: explicit_attention(softmax_dim=-2), r"wrong for query positions"),
    ("check_attend_gqa", lambda s: explicit_attention(head_of=lambda h, g, kv: h % kv),
     r"heads 1\.\.2 \(of 0\.\.3\).*h % kv_heads"),
    ("check_attend_gqa", lambda s: explicit_attention(head_of=lambda h, g, kv: h * 0), r"query heads"),
    ("check_append_and_attend", lambda s: cache_attention(s["attend"], over="new"), "new keys only"),
    ("check_append_and_attend", lambda s: cache_attention(s["attend"], q_start_zero=True), "q_start=0"),
    ("check_append_and_attend", lambda s: cache_attention(s["attend"], over="all"), "past end were never"),
    ("check_append_and_attend", lambda s: cache_attention(s["attend"], over="before_end"),
     r"wrong for query positions 3 \(of 0\.\.3\)"),
    ("check_append_and_attend", lambda s: cache_attention(s["attend"], append=False), "not written at all"),
    ("check_append_and_attend", lambda s: cache_attention(explicit_attention(mask="none")),
     "there is no causal mask"),
]


@pytest.mark.parametrize("check, wrong, message", WRONG_ANSWERS,
                         ids=[f"{c}-{w.__name__}-{i}" for i, (c, w, _) in enumerate(WRONG_ANSWERS)])
def test_checks_name_the_mistake(solution, check, wrong, message):
    with pytest.raises(CheckFailed, match=f"(?s){message}"):
        getattr(checks, check)(wrong(solution))


@pytest.mark.parametrize("check", ["check_append_kv", "check_attend", "check_attend_gqa",
                                   "check_append_and_attend"])
def test_unimplemented_and_crashing_answers_fail_with_the_input_named(check):
    def unimplemented(*args):
        raise NotImplementedError()

    def crashes(*args):
        raise IndexError("index 7 is out of bounds")

    with pytest.raises(CheckFailed, match="is not implemented yet"):
        getattr(checks, check)(unimplemented)
    with pytest.raises(CheckFailed, match=r"(?s)raised IndexError: index 7.*on input: .*prefill"):
        getattr(checks, check)(crashes)


@pytest.fixture
def one_thread():
    """The engine checks run tiny matrices; on a CPU shared with other jobs, more threads only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def contiguous_llm():
    """The engine as exercise 01 sets it up: the shipped model on the contiguous cache."""
    return LLM("tiny", kv_cache="contiguous")


@pytest.mark.usefixtures("one_thread")
def test_engine_check_passes_the_solution_and_restores_the_engine(solution, contiguous_llm, capsys):
    backend = contiguous_llm.llm_engine.model_runner.attn_backend
    before = backend.cache_attention
    checks.check_engine(solution["append_and_attend"], contiguous_llm)
    assert "check_engine passed" in capsys.readouterr().out
    assert backend.cache_attention is before


@pytest.mark.parametrize("wrong, message", [
    (lambda s: cache_attention(explicit_attention(mask="none")), "generated token 0 comes from the prefill"),
    (lambda s: cache_attention(s["attend"], q_start_zero=True), "comes from a decode step"),
    (lambda s: lambda q, *rest: q[:, :1],
     r"(?s)engine failed.*last call.*q \[\d+, 4, 64\].*start=0, and it returned \[\d+, 1, 64\]"),
])
@pytest.mark.usefixtures("one_thread")
def test_engine_check_fails_wrong_answers_inside_the_engine(solution, contiguous_llm, wrong, message):
    before = contiguous_llm.llm_engine.model_runner.attn_backend.cache_attention
    with pytest.raises(CheckFailed, match=message):
        checks.check_engine(wrong(solution), contiguous_llm)
    assert contiguous_llm.llm_engine.model_runner.attn_backend.cache_attention is before
    assert not contiguous_llm.llm_engine.has_unfinished_requests()


def test_engine_check_refuses_another_cache(solution, tiny_llm):
    with pytest.raises(CheckFailed, match="create it with LLM\\(model, kv_cache='contiguous'\\)"):
        checks.check_engine(solution["append_and_attend"], tiny_llm)


def test_prepare_restores_edited_deleted_and_inflated_checks(tmp_path):
    release = check_cells(read(EXERCISE))
    nb = read(SOLUTION)
    own = check_cells(nb)
    own[0].cell.source = "pass  # edited"
    own[0].cell.metadata["nbgrader"]["points"] = 100
    del nb.cells[own[-1].index]  # the engine check, deleted
    nb.cells.append(new_code_cell("pass", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                 "grade_id": "bonus", "points": 50}}))
    duplicate = copy.deepcopy(own[1].cell)
    duplicate["id"] = "copy-of-a-check"
    nb.cells.append(duplicate)
    write(nb, tmp_path / "tampered.ipynb")

    prepared, graded = prepare(tmp_path / "tampered.ipynb", release)
    assert [(c.grade_id, c.points, c.cell.source) for c in graded] == \
        [(c.grade_id, c.points, c.cell.source) for c in release]
    assert graded[-1].index == len(prepared.cells) - 1  # the deleted check runs last
    assert len({c.get("id") for c in prepared.cells}) == len(prepared.cells)


def grade_rows(tmp_path: Path, notebooks: dict[str, Path], timeout: int, release: Path | None,
               report: str) -> dict:
    """Run minillm-grade on copies of the notebooks; {(name, check_id): row}."""
    paths = []
    for name, source in notebooks.items():
        paths.append(tmp_path / f"{name}.ipynb")
        shutil.copy(source, paths[-1])
    # Two at a time, one thread each: this machine's two cores, and the order of the report is tested.
    argv = [*map(str, paths), "--report", report, "--timeout", str(timeout), "--jobs", "2"]
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        env.setenv("OMP_NUM_THREADS", "1")  # the kernels share this machine's cores with other jobs
        env.setenv("MINILLM_MODEL", "tiny")  # also on a GPU machine, where the course would pick SmolLM2
        assert grade.main(argv + (["--release", str(release)] if release else [])) == 0
    (tmp_path / "grade.log").write_text(stderr.getvalue())  # the progress, and cells that raised outside checks
    return _rows(stdout.getvalue() if report == "-" else Path(report).read_text(encoding="utf-8"))


def _rows(report: str) -> dict:
    return {(Path(r["submission"]).stem, r["check_id"]): r for r in csv.DictReader(io.StringIO(report))}


def grade_pair(tmp_path_factory, solution: Path, exercise: Path) -> dict:
    """A chapter's solution and its untouched exercise, graded against the exercise's checks."""
    tmp = tmp_path_factory.mktemp(f"grade-{solution.stem}")
    return grade_rows(tmp, {"solution": solution, "exercise": exercise}, timeout=300, release=exercise,
                      report=str(tmp / "grades.csv"))


def grade_pair_in_child(tmp: Path, solution: Path, exercise: Path) -> dict:
    """grade_pair through the command line, in a process of its own, one submission at a time, so
    that two chapters can be graded at once (grade_rows redirects this process's output)."""
    paths = [tmp / "solution" / "solution.ipynb", tmp / "exercise" / "exercise.ipynb"]
    for source, path in zip((solution, exercise), paths):
        path.parent.mkdir()
        for neighbour in source.parent.glob("[0-9][0-9]_*.ipynb"):  # the capstone reads the exercises beside it
            shutil.copy(neighbour, path.parent)
        shutil.copy(source, path)
    command = [sys.executable, "-m", "minillm.grading.grade", *map(str, paths), "--release", str(exercise),
               "--report", "-", "--timeout", "300"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=700,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "MINILLM_MODEL": "tiny"})
    (paths[0].parent / "grade.log").write_text(result.stderr)  # where assert_full_marks_and_zero reads it
    assert result.returncode == 0, result.stderr[-3000:]
    return _rows(result.stdout)


def assert_full_marks_and_zero(graded: dict, exercise: Path, points: int) -> None:
    """The solution passes every check of the exercise for `points` in all, and no other cell of it
    raised (this run is the solutions' only one in the suite); the untouched exercise fails every
    check, each because it is not implemented yet."""
    ids = [c.grade_id for c in check_cells(read(exercise))]
    solution = [r for (name, _), r in graded.items() if name == "solution"]
    log = (Path(solution[0]["submission"]).parent / "grade.log").read_text()
    assert f"{solution[0]['submission']}: cell" not in log, log
    assert [r["check_id"] for r in solution] == ids
    assert all(r["passed"] == "true" for r in solution), [r["message"] for r in solution]
    assert sum(float(r["points_earned"]) for r in solution) == points
    untouched = [r for (name, _), r in graded.items() if name == "exercise"]
    assert len(untouched) == len(ids) and all(r["points_earned"] == "0" for r in untouched)
    assert all("is not implemented yet" in r["message"] for r in untouched), [r["message"] for r in untouched]


@pytest.fixture(scope="module")
def graded_repo(tmp_path_factory) -> dict:
    """The solution and the untouched exercise, graded once for the tests below."""
    return grade_pair(tmp_path_factory, SOLUTION, EXERCISE)


@pytest.mark.slow
def test_the_solution_gets_full_marks(graded_repo):
    rows = [r for (name, _), r in graded_repo.items() if name == "solution"]
    assert [r["check_id"] for r in rows] == [c.grade_id for c in check_cells(read(EXERCISE))]
    assert all(r["passed"] == "true" and r["points_earned"] == r["points_possible"] for r in rows), rows
    assert sum(float(r["points_earned"]) for r in rows) == 10
    log = (Path(rows[0]["submission"]).parent / "grade.log").read_text()
    assert f"{rows[0]['submission']}: cell" not in log, log  # no other cell raised either


@pytest.mark.slow
def test_the_untouched_exercise_gets_zero_with_a_reason_per_check(graded_repo):
    rows = [r for (name, _), r in graded_repo.items() if name == "exercise"]
    assert len(rows) == 5
    for row in rows:
        assert row["passed"] == "false" and row["points_earned"] == "0", row
        assert "is not implemented yet" in row["message"], row


def synthetic(tmp_path: Path, name: str, *sources: str) -> Path:
    """A notebook whose cells starting with '# check' are check cells worth one point."""
    cells = []
    for i, source in enumerate(sources):
        check = {"grade": True, "solution": False, "locked": True, "points": 1, "grade_id": f"{name}-{i}"}
        is_check = source.startswith("# check")
        cells.append(new_code_cell(source, metadata={"nbgrader": check} if is_check else {}))
    path = tmp_path / "src" / f"{name}.ipynb"
    path.parent.mkdir(exist_ok=True)
    write(new_notebook(cells=cells), path)
    return path


@pytest.mark.slow
def test_a_hanging_or_crashing_submission_costs_only_itself(tmp_path):
    notebooks = {
        "loops": synthetic(tmp_path, "loops", "# check\nx = 1", "while True:\n    pass", "# check\nx = 2"),
        "crashes": synthetic(tmp_path, "crashes", "import os\nos._exit(1)", "# check\nx = 1"),
        "fine": synthetic(tmp_path, "fine", "# check\nx = 1", "raise KeyError('no check here')",
                          "# check\nraise ValueError('x must be 2')"),
    }
    rows = grade_rows(tmp_path, notebooks, timeout=20, release=None, report="-")
    summary = {key: (r["passed"], r["points_earned"], r["message"]) for key, r in rows.items()}
    # Graded two at a time, "loops" finishes last and is still reported first: the order given.
    assert [name for name, _ in rows] == ["loops", "loops", "crashes", "fine", "fine"]
    assert summary == {
        ("loops", "loops-0"): ("true", "1", ""),
        ("loops", "loops-2"): ("false", "0", "timeout after 20s"),
        ("crashes", "crashes-1"): ("false", "0", summary[("crashes", "crashes-1")][2]),
        ("fine", "fine-0"): ("true", "1", ""),
        ("fine", "fine-2"): ("false", "0", "ValueError: x must be 2"),
    }
    # A cell outside the checks that raised costs nothing, and the instructor is told.
    assert f"{tmp_path / 'fine.ipynb'}: cell 1 raised KeyError: 'no check here', outside the checks" in \
        (tmp_path / "grade.log").read_text()
    assert summary[("crashes", "crashes-1")][2].startswith("not run: the kernel died in cell 0")


@pytest.mark.slow
def test_what_a_submission_writes_to_its_temporary_folder_goes_with_it(tmp_path):
    where = tmp_path / "where.txt"
    writes = synthetic(tmp_path, "writes", f"import tempfile\nopen({str(where)!r}, 'w').write(tempfile.mkdtemp())",
                       "# check\nx = 1")
    [row] = grade.grade_submission(writes, None, timeout=60)
    assert row.passed and where.read_text() and not Path(where.read_text()).exists()


@pytest.mark.parametrize("option", [["--jobs", "0"], ["--timeout", "0"]])
def test_a_bad_option_is_refused_by_name(option, tmp_path, capsys):
    with pytest.raises(SystemExit):
        grade.main([str(tmp_path / "a.ipynb"), "--report", "-", *option])
    assert f"{option[0]} must be" in capsys.readouterr().err


def test_unreadable_or_checkless_submissions_are_reported_not_fatal(tmp_path):
    (tmp_path / "garbage.ipynb").write_text("{not json")
    rows = grade.grade_submission(tmp_path / "garbage.ipynb", check_cells(read(EXERCISE)), timeout=5)
    assert len(rows) == 5 and all(r.message.startswith("not run: could not read the notebook") for r in rows)
    [row] = grade.grade_submission(synthetic(tmp_path, "bare", "x = 1"), None, timeout=5)
    assert (row.check_id, row.passed) == ("(notebook)", False)
    assert row.message.startswith("not run: the notebook has no check cells")


def test_summary_adds_up_each_submission_and_shows_its_whole_first_problem():
    long = ("CheckFailed: attend(q, k, v) differs from the reference by 0.31 at position 7: the mask lets "
            "each query see the keys after it, so the future leaks into the past")
    rows = [Row("a.ipynb", "one", True, 2.0, 2.0, ""),
            Row("a.ipynb", "two", False, 0.0, 3.0, f"{long}\n  on input: 2 sequences of 5 tokens"),
            Row("a.ipynb", "three", False, 0.0, 1.0, "CheckFailed: not shown, the first problem is"),
            Row("b.ipynb", "one", True, 2.0, 2.0, "")]
    header, a, a_input, b = summary(rows).splitlines()
    assert a.split()[:7] == ["a.ipynb", "2", "/", "6", "1", "/", "3"] and a.endswith(f"two: {long}")
    assert a_input.strip() == "on input: 2 sequences of 5 tokens"
    assert a_input.index("on input") == header.index("first problem") + 2, "continued under its column"
    assert b.split() == ["b.ipynb", "2", "/", "2", "1", "/", "1"]
