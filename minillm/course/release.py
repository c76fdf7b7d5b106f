"""Where the course is published: one repository and one release tag. Every notebook's setup cell,
"Open in Colab" badge and links to other notebooks, and every install line and Colab link in the
docs, are written from the two names below (`minillm course sync`); `minillm course release URL TAG`
points them at a fork. tests/course/test_release.py fails when a notebook or a doc disagrees with them.

The setup cell embeds the names as text, so that it knows them before minillm is installed; only
the standard library here, so that reading them (the exercise generator, the tests) loads nothing.
"""

from __future__ import annotations

import posixpath
import re

from minillm.version import __version__

REPOSITORY = "https://github.com/minillm-course/minillm"
# A release tag, never a moving branch: a notebook always runs on the engine it was written for.
TAG = "v0.1.0"

COLAB = "https://colab.research.google.com/github"
COLAB_BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
# The forms in which the course names its own release; sync rewrites each to the current names.
_NAME = r"[A-Za-z0-9_.-]+"
REPOSITORY_PATTERN = re.compile(rf"https://github\.com/(?P<owner>{_NAME})/(?P<name>{_NAME})")
TAG_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a git tag that is also a Docker tag and a URL segment
COLAB_LINK = re.compile(rf"{re.escape(COLAB)}/{_NAME}/{_NAME}/blob/{TAG_PATTERN.pattern}/")
PIP_REQUIREMENT = re.compile(rf"(?P<requirement>minillm(\[[\w,]+\])?) @ git\+{REPOSITORY_PATTERN.pattern}"
                             rf"@{TAG_PATTERN.pattern}")
GRADER_IMAGE = re.compile(rf"minillm-grader:{TAG_PATTERN.pattern}")  # INSTRUCTORS.md's container
# A notebook's link to another notebook of the course, as course_link writes it (label, local path, Colab
# link), or as a bare Colab link; `target` is the linked notebook's path in the repository.
COURSE_LINK = re.compile(rf"\[(?P<label>[^\[\]\n]+)\]\((?:(?P<local>[^()\s]+\.ipynb)\) \(\[on Colab\]\()?"
                         rf"{COLAB_LINK.pattern}(?P<target>[^()\s]+\.ipynb)\)(?(local)\))")


def setup_cell(repository: str = REPOSITORY, tag: str = TAG) -> str:
    """The first cell of every notebook. A minillm of this version that is already importable (a
    clone installed with `make course`, a wheel, CI) is used as it is; only Colab installs one."""
    return f'''# Setup: the same first cell in every chapter.
# On Colab, unless minillm {__version__} is importable already, this installs it from the course
# release; Colab's torch, ipywidgets and plotly are kept.
import importlib.util
import sys

if importlib.util.find_spec("minillm"):
    from minillm.version import __version__ as minillm_version
else:
    minillm_version = None
if "google.colab" in sys.modules and minillm_version != "{__version__}":
    !pip install -q "minillm[serve] @ git+{repository}@{tag}"

from minillm.course.setup import setup

course = setup()  # device: cuda, then mps, then cpu; model: $MINILLM_MODEL, else SmolLM2 (CUDA) or tiny (mps, CPU)'''


def colab_url(notebook: str, repository: str = REPOSITORY, tag: str = TAG) -> str:
    """Colab's page for a notebook of the release, by its path in the repository."""
    return f"{COLAB}/{slug(repository)}/blob/{tag}/{notebook}"


def colab_badge(notebook: str, repository: str = REPOSITORY, tag: str = TAG) -> str:
    return f"[![Open In Colab]({COLAB_BADGE_IMAGE})]({colab_url(notebook, repository, tag)})"


def course_link(label: str, notebook: str, target: str, repository: str = REPOSITORY, tag: str = TAG) -> str:
    """notebook's link to target (both paths in the repository) in two forms: the relative path, which a
    local JupyterLab opens beside it (and GitHub follows), then Colab's page, since Colab opens each
    notebook on its own and cannot follow a relative link."""
    local = posixpath.relpath(target, posixpath.dirname(notebook))
    return f"[{label}]({local}) ([on Colab]({colab_url(target, repository, tag)}))"


def pair_links(text: str, notebook: str, repository: str = REPOSITORY, tag: str = TAG) -> str:
    """notebook's text with every link to a notebook of the course written by course_link."""
    return COURSE_LINK.sub(lambda m: course_link(m["label"], notebook, m["target"], repository, tag), text)


def pin_links(text: str, repository: str = REPOSITORY, tag: str = TAG) -> str:
    """text with every install line, Colab link and grader image of the course naming this release."""
    text = PIP_REQUIREMENT.sub(lambda m: f"{m['requirement']} @ git+{repository}@{tag}", text)
    text = COLAB_LINK.sub(f"{COLAB}/{slug(repository)}/blob/{tag}/", text)
    return GRADER_IMAGE.sub(f"minillm-grader:{tag}", text)


def retarget_colab_links(text: str, old_path: str, new_path: str) -> str:
    """Colab links to old_path, of whatever repository and tag, opening new_path instead."""
    return re.sub(rf"({COLAB_LINK.pattern}){re.escape(old_path)}(?![\w.-])", rf"\g<1>{new_path}", text)


def slug(repository: str) -> str:
    """'owner/name' of a GitHub repository URL."""
    match = REPOSITORY_PATTERN.fullmatch(repository)
    if match is None:
        raise ValueError(f"the repository must be a GitHub URL, https://github.com/OWNER/NAME (Colab opens "
                         f"notebooks from GitHub), got {repository!r}")
    return f"{match['owner']}/{match['name']}"
