"""The chapters read as one book: one title style, links to the next chapter and to the exercise that
work both in a local JupyterLab (relative) and on Colab, questions whose answers are in ANSWERS.md
(never in the learner's notebook), in chapter order, and a map that lists them. The long documents
beside them open with a table of contents that lists their sections."""

from __future__ import annotations

import re

import nbformat
import pytest
from notebook_runs import ROOT

from minillm.course.engine_map import MARK, engine_map
from minillm.course.release import COURSE_LINK, colab_badge, course_link
from minillm.course.run_time import run_time_note
from minillm.course.sync import chapter_header

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


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_each_link_to_a_notebook_opens_it_locally_and_on_colab(path):
    """A relative link alone breaks on Colab, which opens each notebook on its own; a Colab link alone
    takes a local learner out of JupyterLab. Every link to a notebook is both (`minillm course sync`)."""
    text = markdown(path)
    for link in COURSE_LINK.finditer(text):
        assert link["local"], f"{path.name}: {link[0]} has no local link; run `minillm course sync`"
        assert (path.parent / link["local"]).resolve() == ROOT / link["target"], link[0]
        assert (ROOT / link["target"]).is_file(), f"{path.name}: {link[0]} links a notebook that does not exist"
    rest = COURSE_LINK.sub("", text).replace(colab_badge(f"notebooks/{path.name}"), "")  # the badge opens itself
    single = re.findall(r"\]\([^)\s]*\.ipynb\)", rest)
    assert not single, f"{path.name}: links to a notebook in one form only; run `minillm course sync`: {single}"


@pytest.mark.parametrize("path, following", zip(CHAPTERS, CHAPTERS[1:]), ids=lambda p: p.name)
def test_each_chapter_links_the_next_one(path, following):
    link = f"**Next: {course_link(title(following), f'notebooks/{path.name}', f'notebooks/{following.name}')}**"
    assert link in markdown(path), f"{path.name} must end with {link}"


@pytest.mark.parametrize("exercise", sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.name)
def test_each_exercise_is_linked_from_its_chapter(exercise):
    [chapter] = (ROOT / "notebooks").glob(f"{exercise.name[:2]}_*.ipynb")
    targets = [link["target"] for link in COURSE_LINK.finditer(markdown(chapter)) if link["local"]]
    assert f"exercises/{exercise.name}" in targets, f"{chapter.name} must link {exercise.name}, locally and on Colab"


def test_the_answers_are_in_chapter_order():
    text = (ROOT / "ANSWERS.md").read_text()
    for part in text.split("\n## ")[1:]:
        numbers = re.findall(r"^### (?:Exercise )?(\d\d)\b", part, re.M)
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), (
            f"ANSWERS.md, '## {part.splitlines()[0]}': sections {numbers} must run in chapter order, once each")


def test_the_course_map_lists_every_chapter_in_order():
    text = (ROOT / "notebooks" / "README.md").read_text()
    places = [text.find(title(path)) for path in CHAPTERS]
    assert -1 not in places, f"notebooks/README.md lacks {[title(p) for p, i in zip(CHAPTERS, places) if i < 0]}"
    assert places == sorted(places)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_each_chapter_opens_with_the_engine_map_marking_its_parts_and_its_run_time(path):
    cells = nbformat.read(path, as_version=4).cells
    chapter = int(path.name[:2])
    assert MARK in engine_map(chapter), f"engine_map.PARTS marks no part for chapter {path.name[:2]}"
    assert cells[2].source == chapter_header(chapter), f"{path.name}: the cell after the title must be the " \
                                                       "engine's map and the run time; run `minillm course sync`"
    note = run_time_note(chapter)
    assert re.search(r"About \d+ s on a 2-core CPU .*\(measured\); \d+ to \d+ min on a Colab T4 .*\(estimated", note)
    assert "What a CPU run cannot show here: " in note


def test_each_glossary_term_is_used_by_the_chapters_it_cites():
    """A glossary entry sends the reader to chapters: its first name must appear in each of them."""
    text = (ROOT / "notebooks" / "GLOSSARY.md").read_text()
    chapters = {path.name[:2]: markdown(path).lower() for path in CHAPTERS}
    for entry in text.split("\n## ")[1:]:
        heading, body = entry.split("\n", 1)
        cited = re.fullmatch(r".*\bChapters? ([\d, and]+)\.", body.strip(), re.S)
        assert cited, f"GLOSSARY.md, {heading!r}: end with the chapter(s) it is taught in, 'Chapter NN.'"
        term = re.split(r",| \(", heading)[0].lower()
        for number in re.findall(r"\d\d", cited[1]):
            assert term in chapters[number], f"GLOSSARY.md cites chapter {number} for {heading!r}, which never says it"


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
