"""`minillm course sync` and `minillm course release URL TAG`: the course's files rewritten from
minillm/course/release.py, after pointing it at a fork for `release`.

In every notebook of notebooks/, solutions/ and exercises/: the setup cell (cell 0), the badge atop
the title cell (cell 1), every course link, and every link to another notebook in its two forms, local
and Colab's (release.course_link); in each chapter, the engine's map after the title cell
(engine_map.py) with the chapter's run time under it (run_time.py); in the Markdown docs at the top
of the repository and in those folders: every course link (release.pin_links). exercises/ is
rewritten like the others, not regenerated, so that a public copy without solutions/ can be synced
too; an exercise rewritten so is byte for byte what `python -m minillm.grading.exercises` would
generate (tests/course/test_release.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from nbformat import NotebookNode
from nbformat.v4 import new_markdown_cell

from minillm.course.engine_map import MAP_HEADING, engine_map
from minillm.course.release import REPOSITORY, TAG, TAG_PATTERN, colab_badge, pair_links, pin_links, setup_cell, slug
from minillm.course.run_time import run_time_note
from minillm.grading.notebook import read, write
from minillm.version import __version__

NOTEBOOK_FOLDERS = ("notebooks", "solutions", "exercises")
SOURCE = Path("minillm", "course", "release.py")
CHAPTER = re.compile(r"notebooks/(?P<number>\d\d)_\w+\.ipynb")  # a chapter gets the engine's map


def sync(root: Path, repository: str = REPOSITORY, tag: str = TAG, *, write_files: bool = True) -> list[Path]:
    """Rewrite every setup cell, badge and course link under root to name repository and tag; returns
    the files changed (with write_files=False, the files that would change, changing none)."""
    if not (root / "notebooks").is_dir():
        raise ValueError(f"{root.resolve()} has no notebooks/: run this at the course repository's root, or "
                         "pass --root")
    changed = []
    for path in sorted(root.glob("*.md")) + sorted(p for f in NOTEBOOK_FOLDERS for p in (root / f).glob("*.md")):
        text = path.read_text(encoding="utf-8")
        pinned = pin_links(text, repository, tag)
        if pinned != text:
            changed.append(path)
            if write_files:
                path.write_text(pinned, encoding="utf-8")
    for path in sorted(p for f in NOTEBOOK_FOLDERS for p in (root / f).glob("*.ipynb")):
        nb = read(path)
        if _sync_notebook(nb, path.relative_to(root).as_posix(), repository, tag):
            changed.append(path)
            if write_files:
                write(nb, path)
    return changed


def _sync_notebook(nb: NotebookNode, notebook: str, repository: str, tag: str) -> bool:
    """Give nb the setup cell first, the badge atop its title cell and its links to other notebooks in both
    forms; True if anything changed."""
    before = [cell.source for cell in nb.cells]
    nb.cells[0].source = setup_cell(repository, tag)
    title_lines = nb.cells[1].source.split("\n")
    if title_lines[0].startswith("[![Open In Colab]"):
        title_lines = title_lines[1:]
    nb.cells[1].source = "\n".join([colab_badge(notebook, repository, tag), *title_lines])
    for cell in nb.cells[1:]:
        cell.source = pair_links(pin_links(cell.source, repository, tag), notebook, repository, tag)
    if (chapter := CHAPTER.fullmatch(notebook)) is not None:
        _place_map(nb, int(chapter["number"]))
    return [cell.source for cell in nb.cells] != before


def chapter_header(chapter: int) -> str:
    """The cell after a chapter's title: the engine's map with the chapter's parts marked, then its run time."""
    return f"{engine_map(chapter)}\n\n{run_time_note(chapter)}"


def _place_map(nb: NotebookNode, chapter: int) -> None:
    """The chapter's header (chapter_header) as the cell after the title (added if missing)."""
    source = chapter_header(chapter)
    if nb.cells[2].cell_type == "markdown" and nb.cells[2].source.startswith(MAP_HEADING):
        nb.cells[2].source = source
    else:
        nb.cells.insert(2, new_markdown_cell(source))


def release(root: Path, repository: str, tag: str, *, write_files: bool = True) -> list[Path]:
    """Point root's minillm/course/release.py at repository and tag, then sync; returns the files changed
    (with write_files=False, the files that would change, changing none)."""
    repository = checked_release(repository, tag)
    source = root / SOURCE
    if not source.is_file():
        raise ValueError(f"{root.resolve()} has no {SOURCE}: run this at the course repository's root, or "
                         "pass --root")
    text = source.read_text(encoding="utf-8")
    rewritten = _assign(_assign(text, "REPOSITORY", repository, source), "TAG", tag, source)
    changed = [source] if rewritten != text else []
    if changed and write_files:
        source.write_text(rewritten, encoding="utf-8")
    return changed + sync(root, repository, tag, write_files=write_files)


def checked_release(repository: str, tag: str) -> str:
    """The repository URL in its plain form; a ValueError that says what is wrong with either name."""
    repository = repository.rstrip("/").removesuffix(".git")
    slug(repository)
    if not TAG_PATTERN.fullmatch(tag):
        raise ValueError(f"the tag must be letters, digits, '.', '_' or '-' (it is also a Docker tag and part of "
                         f"a URL), got {tag!r}")
    # The setup cell installs from the tag only when this version is missing, so the tag must hold it.
    if not re.search(rf"(?<![\d.]){re.escape(__version__)}(?![\d.])", tag):
        raise ValueError(f"the tag must name the version it releases, {__version__} (minillm/version.py), "
                         f"e.g. v{__version__} or v{__version__}-spring; got {tag!r}")
    return repository


def _assign(text: str, name: str, value: str, source: Path) -> str:
    rewritten, count = re.subn(rf'^{name} = "[^"\n]*"', lambda _: f'{name} = "{value}"', text, flags=re.M)
    if count != 1:
        raise ValueError(f'{source} must assign {name} = "..." exactly once, on a line of its own')
    return rewritten
