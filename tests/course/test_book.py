"""The chapters read as one book: one title style, a Colab-safe link to the next chapter, questions
whose answers are in INSTRUCTORS.md (never in the learner's notebook), and a map that lists them."""

from __future__ import annotations

import re

import nbformat
import pytest
from notebook_runs import ROOT

from minillm.course.release import colab_url

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TITLE = re.compile(r"^# (\d\d) · (.+)$", re.M)


def markdown(path) -> str:
    return "\n\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


def title(path) -> str:
    match = TITLE.search(markdown(path))
    assert match and match[1] == path.name[:2], f"{path.name}: the title must read '# {path.name[:2]} · Title'"
    return f"{match[1]} · {match[2]}"


def questions(text: str) -> list[str]:
    """The numbered items of the '## Questions' section."""
    section = text.split("## Questions", 1)[1]
    section = re.split(r"\n#{1,3} |\n\*\*Next", section)[0]
    return re.findall(r"^(\d+)\. ", section, re.M)


def answers(number: str) -> list[str]:
    text = (ROOT / "INSTRUCTORS.md").read_text()
    match = re.search(rf"^### {number} · .*?$(.*?)(?=^### |^## |\Z)", text, re.M | re.S)
    assert match, f"INSTRUCTORS.md has no '### {number} · ...' section of answers"
    return re.findall(r"^(\d+)\. ", match[1], re.M)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_each_chapter_has_the_title_style_and_questions_answered_for_instructors(path):
    title(path)
    text = markdown(path)
    assert "## Questions" in text, f"{path.name}: end with a '## Questions' section"
    assert "<details>" not in text, f"{path.name}: answers belong in INSTRUCTORS.md, not in the learner's notebook"
    asked = questions(text)
    assert asked and asked == answers(path.name[:2]), (
        f"{path.name}: questions {asked} but INSTRUCTORS.md answers {answers(path.name[:2])}")
    relative = re.findall(r"\]\((?!https?://)[^)]*\.ipynb\)", text)
    assert not relative, f"{path.name}: relative notebook links break on Colab: {relative}"


@pytest.mark.parametrize("path, following", zip(CHAPTERS, CHAPTERS[1:]), ids=lambda p: p.name)
def test_each_chapter_links_the_next_one_on_colab(path, following):
    link = f"**Next: [{title(following)}]({colab_url(f'notebooks/{following.name}')})**"
    assert link in markdown(path), f"{path.name} must end with {link}"


def test_the_course_map_lists_every_chapter_in_order():
    text = (ROOT / "notebooks" / "README.md").read_text()
    places = [text.find(title(path)) for path in CHAPTERS]
    assert -1 not in places, f"notebooks/README.md lacks {[title(p) for p, i in zip(CHAPTERS, places) if i < 0]}"
    assert places == sorted(places)
