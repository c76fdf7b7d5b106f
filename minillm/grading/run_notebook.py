"""Run one prepared submission in a fresh kernel and record each check cell's verdict.

    python -m minillm.grading.run_notebook NOTEBOOK RESULTS --timeout SECONDS --cwd DIR

This is the grader's child process: `minillm-grade` starts one per submission, so a submission
that crashes or hangs its kernel, or this process, costs that submission alone. Every cell runs,
failing or not, so that each check gets its own verdict, until the time is up. RESULTS gets one
JSON line per check as it finishes, one per other cell that raised (a measurement cell, say: no
points ride on it, but the instructor is told), then one line saying how the run ended; whatever
was written before a crash is kept.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import IO, Any

from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

from minillm.grading.notebook import checks, read


class _ErrorsOnlyClient(NotebookClient):
    """Keeps only error outputs: they are all grading needs, and dropping the rest bounds the
    memory a submission that prints in a loop can cost."""

    def output(self, outs: list, msg: dict[str, Any], display_id: str | None, cell_index: int) -> Any:
        if msg["msg_type"] != "error":
            return None
        return super().output(outs, msg, display_id, cell_index)


def run(notebook: Path, results: IO[str], timeout: float, cwd: Path) -> None:
    deadline = time.monotonic() + timeout
    nb = read(notebook)
    graded = {c.index: c.grade_id for c in checks(nb)}
    client = _ErrorsOnlyClient(nb, kernel_name="python3", allow_errors=True, shutdown_kernel="immediate",
                               resources={"metadata": {"path": str(cwd)}})

    def emit(**record: Any) -> None:
        results.write(json.dumps(record) + "\n")
        results.flush()

    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return emit(end="timeout")
            client.timeout = math.ceil(remaining)
            try:
                client.execute_cell(cell, index)
            except CellTimeoutError:
                return emit(end="timeout")
            except DeadKernelError:
                return emit(end="kernel died", cell=index)
            errors = [o for o in cell.outputs if o.output_type == "error"] if cell.cell_type == "code" else []
            message = f"{errors[0].ename}: {errors[0].evalue}" if errors else ""
            if index in graded:
                emit(grade_id=graded[index], passed=not errors, message=message)
            elif errors:
                emit(cell=index, error=message)
    emit(end="done")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.grading.run_notebook", description=__doc__)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--cwd", type=Path, required=True)
    args = parser.parse_args(argv)
    with args.results.open("a", encoding="utf-8") as results:
        run(args.notebook, results, args.timeout, args.cwd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
