"""Notebook outputs never reach git: `make course` sets nbstripout up as the clone's git filter
(scripts/notebook_filter.sh). Checked in a git repository of its own holding a chapter, as whichever user
runs the suite (root in CI): a chapter that ran has nothing to commit, a notebook staged with outputs is
stored without them, the course's own notebooks pass the filter unchanged, and setting the filter up
twice changes nothing."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from ipykernel.ipkernel import IPythonKernel

from minillm.grading.notebook import read, write

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "notebook_filter.sh"
NOTEBOOKS = sorted(p for folder in ("notebooks", "solutions", "exercises") for p in (ROOT / folder).glob("*.ipynb"))
CHAPTER = Path("notebooks", "01_kv_cache.ipynb")


def git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def set_up_filter(repo: Path) -> None:
    subprocess.run(["bash", str(SCRIPT), sys.executable], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with the filter set up, holding a chapter committed through it. (Each notebook git
    reads runs the filter, a Python process: one chapter keeps this quick.)"""
    repo = tmp_path / "course"
    (repo / CHAPTER.parent).mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "learner@example.com")
    git(repo, "config", "user.name", "Learner")
    set_up_filter(repo)
    shutil.copy(ROOT / CHAPTER, repo / CHAPTER)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "course")
    return repo


def test_make_course_sets_the_filter_up():
    command = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(ROOT), f"VENV={sys.prefix}",
                              "-o", f"{sys.prefix}/.installed", "course"], capture_output=True, text=True,
                             check=True).stdout
    assert f"bash scripts/notebook_filter.sh {sys.prefix}/bin/python" in command, command


def test_the_course_notebooks_pass_the_filter_unchanged(repo):
    """Else every clone with the filter would see the notebooks it has never opened as modified."""
    assert git(repo, "show", f"HEAD:{CHAPTER.as_posix()}") == (ROOT / CHAPTER).read_bytes()
    clean = shlex.split(git(repo, "config", "filter.nbstripout.clean").decode())
    verify = subprocess.run([*clean, "--verify", *map(str, NOTEBOOKS)], cwd=repo, capture_output=True, text=True)
    assert verify.returncode == 0, f"the filter would change these committed notebooks:\n{verify.stdout}"


def ran(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """nb as Jupyter saves it after a sitting: what the kernel says of its language, outputs, counts, timings
    and widget state."""
    nb.metadata.language_info = IPythonKernel.language_info
    nb.metadata.widgets = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    for count, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), start=1):
        cell.execution_count = count
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"output {count}\n"),
                        nbformat.v4.new_output("execute_result", {"text/plain": "42"}, execution_count=count)]
        cell.metadata.execution = {"iopub.status.busy": "2026-01-01T00:00:00.000000Z"}
    return nb


def test_a_notebook_that_ran_is_stored_without_outputs(repo):
    chapter = repo / CHAPTER
    write(ran(read(chapter)), chapter)
    assert json.loads(chapter.read_text())["cells"][0]["outputs"], "the working file keeps its outputs"
    # git lists a file whose size changed before it filters (`git status`: M), but it has nothing to commit.
    assert git(repo, "diff", "--no-textconv") == b"", "a sitting must leave git with nothing to commit"
    git(repo, "add", "-A")
    assert git(repo, "status", "--porcelain") == b"" and git(repo, "show", f":{CHAPTER.as_posix()}") == (
        ROOT / CHAPTER).read_bytes()

    new = repo / "notebooks" / "scratch.ipynb"
    write(ran(read(chapter)), new)
    git(repo, "add", "notebooks/scratch.ipynb")
    stored = json.loads(git(repo, "show", ":notebooks/scratch.ipynb"))
    code = [c for c in stored["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert "widgets" not in stored["metadata"] and stored["metadata"]["language_info"] == {"name": "python"}
    assert [c["id"] for c in stored["cells"]] == [c.id for c in read(new).cells], "cell ids are kept"


def test_setting_the_filter_up_again_changes_nothing(repo):
    files = [repo / ".git" / "config", repo / ".git" / "info" / "attributes"]
    before = [f.read_bytes() for f in files]
    set_up_filter(repo)
    assert [f.read_bytes() for f in files] == before


def test_outside_a_git_clone_it_says_so_and_lets_the_course_start(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), sys.executable], cwd=tmp_path, capture_output=True, text=True,
                          env={"GIT_CEILING_DIRECTORIES": str(tmp_path.parent), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "notebook outputs are not filtered" in done.stderr
