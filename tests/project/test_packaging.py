"""The project installs what it says, from one source, and its entry points agree with README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "minillm").rglob("__init__.py")}
    found |= {"minillm.widgets." + ".".join(p.parent.relative_to(ROOT / "widgets").parts)
              for p in (ROOT / "widgets").rglob("__init__.py") if p.parent != ROOT / "widgets"}
    found.add("minillm.widgets")
    assert found == listed, "pyproject.toml [tool.setuptools] packages must list exactly the package folders"


def test_dependencies_and_extras():
    deps = " ".join(PYPROJECT["project"]["dependencies"])
    for name in ("torch>=2.4", "transformers", "safetensors", "tokenizers", "huggingface_hub", "tqdm", "numpy",
                 "triton"):
        assert name in deps
    assert "sys_platform == 'linux'" in deps  # triton only where it exists
    extras = PYPROJECT["project"]["optional-dependencies"]
    course = " ".join(extras["course"])
    assert "ipywidgets>=7.7,<9" in course and "plotly>=5.20" in course and "anywidget" in course
    for name in ("pytest", "nbval", "hypothesis", "ruff"):
        assert any(d.startswith(name) for d in extras["dev"])


def test_the_version_has_one_source():
    # minillm/version.py, which the course setup reads without importing the engine.
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "minillm.version.__version__"}


def test_environment_yml_installs_from_pyproject():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s+- -e \.\[course,serve,dev\]$", text, re.M)


def test_readme_commands_are_what_ci_and_make_run():
    readme = (ROOT / "README.md").read_text()
    assert "make course" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q torch==2.13.0" in ci and re.search(r"^make test$", ci, re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: ", makefile, re.M) and re.search(r"^course: ", makefile, re.M)


def test_shipped_models_are_package_data():
    assert "assets/*/*" in PYPROJECT["tool"]["setuptools"]["package-data"]["minillm"]
