"""Record the expected outputs of the notebooks' checked cells (those starting with
`# NBVAL_CHECK_OUTPUT`) into tests/course/notebook_outputs/, by running each notebook on the CPU with the
shipped tiny model. Run it after changing what such a cell prints:

    python scripts/record_notebook_outputs.py [notebooks/01_kv_cache.ipynb ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "course"))
from notebook_runs import NOTEBOOK_ENV, checked_cells, course_notebooks, expected_outputs_file  # noqa: E402


def record(notebook: Path) -> None:
    nb = nbformat.read(notebook, as_version=4)
    if not checked_cells(nb):
        return
    os.environ.update(NOTEBOOK_ENV)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.execute()
    expected = {c.id: [dict(o) for o in c.outputs] for c in checked_cells(nb)}
    path = expected_outputs_file(notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(expected, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"{notebook}: {len(expected)} checked cells -> {path}")


if __name__ == "__main__":
    for arg in sys.argv[1:] or course_notebooks():
        record(Path(arg).resolve())
