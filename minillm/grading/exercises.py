"""Generate exercises/NN_name.ipynb from solutions/NN_name.ipynb, or check that they agree.

    python -m minillm.grading.exercises            # (re)write exercises/
    python -m minillm.grading.exercises --check    # exit 1, naming the files, when exercises/ drifts

In a solution cell, every region between `### BEGIN SOLUTION` and `### END SOLUTION` becomes
`# YOUR CODE HERE` / `raise NotImplementedError()` at the markers' indentation (in markdown,
`YOUR ANSWER HERE`; a markdown solution cell without markers is replaced whole). Outputs, execution
counts, run timings and widget state are dropped, locked cells become read-only in Jupyter, and
Colab links to the solution (its "Open in Colab" badge) open the exercise. The output depends on
nothing but the solution file, so regenerating changes no byte.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

from nbformat import NotebookNode

from minillm.course.release import retarget_colab_links
from minillm.grading.notebook import BEGIN_SOLUTION, END_SOLUTION, dumps, is_solution, nbgrader, read

CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
ANSWER_STUB = "YOUR ANSWER HERE"


class MarkerError(ValueError):
    pass


def exercise_from(solution: NotebookNode, name: str) -> NotebookNode:
    """The exercise for solutions/<name>."""
    nb = copy.deepcopy(solution)
    nb.metadata.pop("widgets", None)
    for index, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        else:
            cell.source = retarget_colab_links(cell.source, f"solutions/{name}", f"exercises/{name}")
        has_markers = any(line.strip() in (BEGIN_SOLUTION, END_SOLUTION) for line in cell.source.split("\n"))
        if has_markers and not is_solution(cell):
            raise MarkerError(f"cell {index} has solution markers but no nbgrader metadata "
                              "solution: true; the grader and nbgrader would not treat it as a solution")
        if is_solution(cell):
            cell.source = _hide_solution(cell, has_markers, index)
        if nbgrader(cell).get("locked"):
            # Jupyter's own read-only flags: an accidental edit of a check is refused in the editor.
            cell.metadata["editable"] = False
            cell.metadata["deletable"] = False
    return nb


def _hide_solution(cell: NotebookNode, has_markers: bool, index: int) -> str:
    if cell.cell_type == "markdown" and not has_markers:
        return ANSWER_STUB
    if not has_markers:
        raise MarkerError(f"code solution cell {index} has no {BEGIN_SOLUTION} / {END_SOLUTION} region "
                          "to hide")
    out: list[str] = []
    inside = False
    for line in cell.source.split("\n"):
        marker = line.strip()
        if marker == BEGIN_SOLUTION:
            if inside:
                raise MarkerError(f"cell {index}: {BEGIN_SOLUTION} inside a solution region")
            inside = True
            indent = line[:len(line) - len(line.lstrip())]
            stub = CODE_STUB if cell.cell_type == "code" else (ANSWER_STUB,)
            out += [indent + s for s in stub]
        elif marker == END_SOLUTION:
            if not inside:
                raise MarkerError(f"cell {index}: {END_SOLUTION} without {BEGIN_SOLUTION}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"cell {index}: {BEGIN_SOLUTION} is never closed by {END_SOLUTION}")
    return "\n".join(out)


def render(solution_path: Path) -> str:
    try:
        return dumps(exercise_from(read(solution_path), solution_path.name))
    except MarkerError as e:
        raise MarkerError(f"{solution_path}: {e}") from None


def expected(root: Path) -> dict[Path, bytes | None]:
    """Every exercise file and the bytes it should hold; None for one that should not exist."""
    wanted: dict[Path, bytes | None] = {
        root / "exercises" / sol.name: render(sol).encode("utf-8")
        for sol in sorted((root / "solutions").glob("*.ipynb"))}
    for ex in sorted((root / "exercises").glob("*.ipynb")):
        wanted.setdefault(ex, None)
    return wanted


def drift(root: Path) -> list[str]:
    """One line per exercise that is stale, missing, or has no solution."""
    problems = []
    for ex, text in expected(root).items():
        if text is None:
            problems.append(f"extra: {ex} has no solutions/{ex.name}")
        elif not ex.exists():
            problems.append(f"missing: {ex} (from solutions/{ex.name})")
        elif ex.read_bytes() != text:
            problems.append(f"stale: {ex} differs from what solutions/{ex.name} generates")
    return problems


def generate(root: Path) -> list[str]:
    """Write each exercise whose bytes would change; remove those without a solution."""
    (root / "exercises").mkdir(exist_ok=True)
    changed = []
    for ex, text in expected(root).items():
        if text is None:
            ex.unlink()
            changed.append(f"removed {ex} (no solutions/{ex.name})")
        elif not ex.exists() or ex.read_bytes() != text:
            ex.write_bytes(text)
            changed.append(f"wrote {ex}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.grading.exercises", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the folder holding solutions/ and exercises/ (default: .)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if exercises/ drifts")
    args = parser.parse_args(argv)
    if not (args.root / "solutions").is_dir():
        parser.error(f"{args.root / 'solutions'} is not a folder")
    try:
        lines = drift(args.root) if args.check else generate(args.root)
    except MarkerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in lines:
        print(line, file=sys.stderr if args.check else sys.stdout)
    if args.check and lines:
        print("exercises/ is out of date: run python -m minillm.grading.exercises", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
