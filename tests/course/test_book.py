"""The chapters read as one book: one title style, a Colab-safe link to the next chapter, questions
whose answers are in ANSWERS.md (never in the learner's notebook), and a map that lists them. The long
documents beside them open with a table of contents that lists their sections."""

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
    text = (ROOT / "ANSWERS.md").read_text()
    match = re.search(rf"^### {number} · .*?$(.*?)(?=^### |^## |\Z)", text, re.M | re.S)
    assert match, f"ANSWERS.md has no '### {number} · ...' section of answers"
    return re.findall(r"^(\d+)\. ", match[1], re.M)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_each_chapter_has_the_title_style_and_questions_answered_for_instructors(path):
    title(path)
    text = markdown(path)
    assert "## Questions" in text, f"{path.name}: end with a '## Questions' section"
    assert "<details>" not in text, f"{path.name}: answers belong in ANSWERS.md, not in the learner's notebook"
    asked = questions(text)
    assert asked and asked == answers(path.name[:2]), (
        f"{path.name}: questions {asked} but ANSWERS.md answers {answers(path.name[:2])}")
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


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but - and _ dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def sections(text: str) -> list[str]:
    """The '## ' headings, outside code blocks (where '## ' may open a shell comment)."""
    found, in_code = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("## "):
            found.append(line[3:])
    return found


@pytest.mark.parametrize("name", ["BENCHMARKS.md", "INSTRUCTORS.md", "ANSWERS.md"])
def test_each_long_document_opens_with_a_table_of_its_sections(name):
    text = (ROOT / name).read_text()
    before_first_section = text.split("\n## ", 1)[0]
    listed = re.findall(r"^- \[(.+)\]\(#([^)]*)\)$", before_first_section, re.M)
    expected = [(heading, anchor(heading)) for heading in sections(text)]
    assert listed == expected, (f"{name}: the table of contents before the first section must list every '## ' "
                                f"section, in order, as '- [Heading](#anchor)':\n"
                                + "\n".join(f"- [{h}](#{a})" for h, a in expected))
