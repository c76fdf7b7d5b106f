"""What a learner installs is enough, and no bigger than it must be: `minillm[course]` (the learner's
install line and the grader's image) brings every package the engine, the widgets and every notebook
import; `make course` installs torch's CPU build where no NVIDIA GPU could use the CUDA one
(scripts/install_torch.sh), falling back to PyPI's with a message."""

from __future__ import annotations

import ast
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def imported_modules() -> dict[str, str]:
    """Every top-level module the package, the widgets and the notebooks import: {module: one importer}."""
    sources = [(p, p.read_text()) for folder in ("minillm", "widgets") for p in sorted((ROOT / folder).rglob("*.py"))]
    for notebook in sorted(p for f in ("notebooks", "solutions", "exercises") for p in (ROOT / f).glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        sources += [(notebook, TransformerManager().transform_cell("".join(c["source"])))
                    for c in cells if c["cell_type"] == "code"]
    found: dict[str, str] = {}
    for path, source in sources:
        for node in ast.walk(ast.parse(source)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def course_closure() -> set[str]:
    """The distributions `pip install minillm[course]` installs on this machine, minillm's own extras
    (such as minillm[serve]) followed through pyproject.toml, the others' through their metadata."""
    pending = [(Requirement(r), None) for r in PROJECT["dependencies"]] + [
        (Requirement(r), "course") for r in PROJECT["optional-dependencies"]["course"]]
    seen: set[str] = set()
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra or ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name == "minillm":
            pending += [(Requirement(r), e) for e in requirement.extras for r in PROJECT["optional-dependencies"][e]]
            continue
        for wanted in [None, *sorted(requirement.extras)]:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            pending += [(Requirement(r), wanted) for r in metadata.requires(requirement.name) or []]
    return {name for name, _ in seen}


def test_the_course_extra_installs_everything_the_course_imports():
    installed = course_closure()
    providers = metadata.packages_distributions()
    missing = {module: importer for module, importer in imported_modules().items()
               if module not in sys.stdlib_module_names and module != "minillm"
               and not {canonicalize_name(d) for d in providers.get(module, [module])} & installed}
    assert not missing, f"minillm[course] does not install what these import (module: first importer): {missing}"


def test_the_server_and_the_git_filter_come_with_the_course_extra():
    """Chapter 07 and its exercise run a server and its client; `make course` sets nbstripout up."""
    assert {"fastapi", "uvicorn", "openai", "prometheus-client", "nbstripout"} <= course_closure()


FAKE_PIP = """#!/usr/bin/env bash
echo "$*" >> "$LOG"
[[ "$*" != *--index-url* || -z "$CPU_INDEX_FAILS" ]]
"""


@pytest.mark.skipif(platform.system() != "Linux", reason="elsewhere the script installs PyPI's torch")
@pytest.mark.parametrize("gpu, cpu_index_fails, calls, says", [
    (False, False, ["install torch --index-url https://download.pytorch.org/whl/cpu"], "PyTorch's CPU build"),
    (False, True, ["install torch --index-url https://download.pytorch.org/whl/cpu", "install torch"],
     "installing PyPI's default build instead"),
    (True, False, ["install torch"], ""),
])
def test_torch_is_the_cpu_build_without_an_nvidia_gpu(tmp_path, gpu, cpu_index_fails, calls, says):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "pip").write_text(FAKE_PIP)
    (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\nexit {0 if gpu else 9}\n")  # -L lists GPUs, or fails
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "pip.log"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "LOG": str(log),
           "CPU_INDEX_FAILS": "1" if cpu_index_fails else ""}
    env.pop("TORCH_CPU_INDEX", None)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install_torch.sh"), str(bin_ / "pip")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == calls
    assert says in done.stdout + done.stderr

