"""Before and after in one run: a script of this tree run against another git revision's `minillm`."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# `python script.py` would put the script's folder first on sys.path, where bench/'s modules
# (quant.py, timing.py, ...) shadow top-level ones; -c puts the working folder there instead.
RUN_BY_PATH = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _git(folder: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ValueError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


@contextmanager
def checkout(rev: str) -> Iterator[tuple[Path, str]]:
    """A temporary worktree of `rev` (detached) of the repository this file is in, and rev's short
    hash; removed afterwards, whatever happens. A folder holding a `minillm` package instead (a tree
    exported with `git archive`, for a machine whose copy of the checkout has no git history) is
    used as it is, named by its folder."""
    exported = Path(rev)
    if (exported / "minillm" / "__init__.py").is_file():
        yield exported.resolve(), exported.name
        return
    repo = Path(_git(Path(__file__).parent, "rev-parse", "--show-toplevel"))
    sha = _git(repo, "rev-parse", "--short", f"{rev}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="minillm-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        _git(repo, "worktree", "add", "--detach", str(tree), sha)
        try:
            yield tree, sha
        finally:
            _git(repo, "worktree", "remove", "--force", str(tree))


def run_against(tree: Path, script: Path, *args: str) -> None:
    """Runs `script` (a file of this tree) with `tree`'s minillm first on the path, in `tree`."""
    path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    subprocess.run([sys.executable, "-c", RUN_BY_PATH, str(script), *args], cwd=tree,
                   env={**os.environ, "PYTHONPATH": path}, check=True)
