"""The course names one repository and tag (minillm/course/release.py): every setup cell, badge, link between
notebooks (relative and Colab's) and doc line agrees with it, the setup cell installs only on Colab and only
when the right minillm is missing, and `minillm course release URL TAG` moves all of it to a fork."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import types
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

import minillm.version
from minillm import cli
from minillm.course.release import REPOSITORY, TAG, colab_url, course_link, setup_cell
from minillm.course.sync import checked_release, release, sync
from minillm.grading import exercises
from minillm.grading.notebook import read, write

ROOT = Path(__file__).resolve().parents[2]
FORK, FORK_TAG = "https://github.com/some-university/llm-course", f"v{minillm.version.__version__}-spring"


def test_every_setup_cell_badge_and_doc_line_names_the_release():
    stale = sync(ROOT, write_files=False)
    assert not stale, f"these disagree with minillm/course/release.py; run `minillm course sync`: {stale}"


def test_the_release_tag_names_the_version_the_setup_cell_expects():
    assert checked_release(REPOSITORY, TAG) == REPOSITORY


def course_copy(tmp_path: Path) -> Path:
    """What `minillm course release` rewrites, copied: the course folders, the docs and the source."""
    for folder in ("notebooks", "solutions", "exercises"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    for doc in ROOT.glob("*.md"):
        shutil.copy(doc, tmp_path)
    (tmp_path / "minillm" / "course").mkdir(parents=True)
    shutil.copy(ROOT / "minillm" / "course" / "release.py", tmp_path / "minillm" / "course")
    return tmp_path


def test_the_drift_check_names_a_stale_setup_cell_badge_and_install_line(tmp_path):
    root = course_copy(tmp_path)
    welcome, solution = root / "notebooks" / "00_welcome.ipynb", root / "solutions" / "01_kv_cache.ipynb"
    nb = read(welcome)
    nb.cells[0].source = nb.cells[0].source.replace("minillm_version != ", "True or minillm_version != ")
    write(nb, welcome)
    nb = read(solution)
    nb.cells[1].source = nb.cells[1].source.replace(f"/blob/{TAG}/", "/blob/main/")
    write(nb, solution)
    instructors = root / "INSTRUCTORS.md"
    instructors.write_text(instructors.read_text().replace(f"@{TAG}", "@v0.0.9", 1))
    assert sync(root, write_files=False) == [instructors, welcome, solution]
    assert sync(root) == [instructors, welcome, solution]
    assert sync(root, write_files=False) == []


NEXT = ("01 · The KV cache", "notebooks/00_welcome.ipynb", "notebooks/01_kv_cache.ipynb")  # chapter 00's last link


def test_a_link_to_a_notebook_is_relative_for_jupyterlab_then_colabs():
    assert course_link(*NEXT) == f"[01 · The KV cache](01_kv_cache.ipynb) ([on Colab]({colab_url(NEXT[2])}))"
    assert course_link("Exercise 01", "notebooks/01_kv_cache.ipynb", "exercises/01_kv_cache.ipynb").startswith(
        "[Exercise 01](../exercises/01_kv_cache.ipynb) ([on Colab](https://colab.research.google.com/github/")


def test_sync_writes_a_colab_only_link_in_both_forms(tmp_path):
    root = course_copy(tmp_path)
    sync(root)
    welcome = root / "notebooks" / "00_welcome.ipynb"
    nb = read(welcome)
    [cell] = [c for c in nb.cells if course_link(*NEXT) in c.source]
    cell.source = cell.source.replace(course_link(*NEXT), f"[{NEXT[0]}]({colab_url(NEXT[2], tag='v0.0.9')})")
    write(nb, welcome)
    assert sync(root, write_files=False) == [welcome]
    assert sync(root) == [welcome]
    assert course_link(*NEXT) in read(welcome).cells[nb.cells.index(cell)].source
    assert sync(root) == []


@pytest.mark.parametrize("on_colab, importable, installs", [
    (False, minillm.version.__version__, False),  # a clone, CI: used as it is
    (True, minillm.version.__version__, False),  # Colab with the release's wheel installed
    (True, None, True),  # a fresh Colab runtime
    (True, "0.0.1", True),  # Colab holding another release
    (False, None, False),  # elsewhere the learner installs it (README), never this cell
])
def test_the_setup_cell_installs_only_on_colab_and_only_without_the_right_minillm(
        on_colab, importable, installs, monkeypatch, capsys):
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if importable is None:
        real_find_spec = sys.modules["importlib.util"].find_spec
        monkeypatch.setattr("importlib.util.find_spec",
                            lambda name, *a: None if name == "minillm" else real_find_spec(name, *a))
    else:
        monkeypatch.setattr(minillm.version, "__version__", importable)
    commands = []
    shell = types.SimpleNamespace(system=commands.append)  # what IPython runs a `!` line with
    exec(TransformerManager().transform_cell(setup_cell()), {"get_ipython": lambda: shell})
    assert commands == ([f'pip install -q "minillm[serve] @ git+{REPOSITORY}@{TAG}"'] if installs else [])
    assert "CourseSetup(device=" in capsys.readouterr().out  # and the rest of the cell ran


def files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_release_points_every_file_at_a_fork(tmp_path):
    root = course_copy(tmp_path)
    before = files(root)
    notebooks = sorted(p for f in ("notebooks", "solutions", "exercises") for p in (root / f).glob("*.ipynb"))
    docs = [p for p in sorted(root.glob("*.md")) if re.search(r"minillm-course/minillm|minillm-grader:", p.read_text())]
    would_change = release(root, FORK + ".git/", FORK_TAG, write_files=False)
    assert files(root) == before, "a dry run changed files"

    changed = release(root, FORK + ".git/", FORK_TAG)
    assert changed == would_change
    assert set(changed) == {root / "minillm" / "course" / "release.py", *docs, *notebooks}
    source = (root / "minillm" / "course" / "release.py").read_text()
    assert re.search(rf'^REPOSITORY = "{FORK}"$', source, re.M) and re.search(rf'^TAG = "{FORK_TAG}"$', source, re.M)
    for path in changed:
        text = path.read_text()
        assert "minillm-course/minillm" not in text and not re.search(rf"[@/:]{re.escape(TAG)}(?![\w.-])", text), path
    assert f'"minillm[serve] @ git+{FORK}@{FORK_TAG}"' in read(root / "notebooks" / "00_welcome.ipynb").cells[0].source
    assert "colab.research.google.com/github/some-university/llm-course/blob/v" in read(
        root / "exercises" / "01_kv_cache.ipynb").cells[1].source
    assert f"minillm-grader:{FORK_TAG}" in (root / "INSTRUCTORS.md").read_text()
    assert course_link(*NEXT, FORK, FORK_TAG) in "\n".join(c.source for c in read(root / NEXT[1]).cells)
    assert exercises.drift(root) == [], "exercises/ must stay what the generator makes of solutions/"
    assert sync(root, FORK, FORK_TAG, write_files=False) == []
    assert release(root, FORK, FORK_TAG) == []


@pytest.mark.parametrize("url, tag, error", [
    ("https://gitlab.com/some/course", FORK_TAG, "must be a GitHub URL"),
    (FORK, "v9", "must name the version it releases"),
    (FORK, f"{FORK_TAG}/x", "letters, digits"),
])
def test_release_refuses_what_a_setup_cell_could_not_install_from(tmp_path, url, tag, error):
    root = course_copy(tmp_path)
    with pytest.raises(ValueError, match=error):
        release(root, url, tag)
    source = Path("minillm", "course", "release.py")
    assert (root / source).read_bytes() == (ROOT / source).read_bytes()


def test_the_command_reports_what_it_would_change(tmp_path, capsys):
    root = course_copy(tmp_path)
    cli.main(["course", "release", FORK, FORK_TAG, "--root", str(root), "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    assert out == [f"would update {path}" for path in release(root, FORK, FORK_TAG, write_files=False)]
    assert f"would update {root / 'minillm' / 'course' / 'release.py'}" in out
    cli.main(["course", "sync", "--root", str(root)])
    assert capsys.readouterr().out == "nothing to change\n"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["course", "sync", "--root", str(tmp_path / "elsewhere")])
    assert exit_.value.code == 2 and "has no notebooks/" in capsys.readouterr().err


@pytest.mark.parametrize("device,interpreted", [("cpu", "1"), ("mps", "1"), ("cuda", None)])
def test_setup_switches_on_tritons_interpreter_without_a_cuda_gpu(monkeypatch, device, interpreted):
    """Triton reads TRITON_INTERPRET once, when first imported, and a chapter's imports (transformers)
    import it: the setup cell, which runs first, must set it wherever Triton cannot compile."""
    course_setup = importlib.import_module("minillm.course.setup")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(course_setup, "default_device", lambda: device)
    course_setup.setup()
    assert os.environ.get("TRITON_INTERPRET") == interpreted
