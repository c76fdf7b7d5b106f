"""The capstone's pieces: the functions a learner wrote in exercises 00 to 08, taken from their own
notebooks, found beside the capstone's notebook (the grader runs a submission in its own folder).

Only a notebook's answer cells run (nbgrader's solution cells), after the imports of the cells before
them: never its measurements, which take minutes. A piece that cannot be used (no notebook, no such
function, an answer still `raise NotImplementedError()`) is replaced by a stand-in that raises a
CheckFailed naming it, so that one missing piece is one clear line, not a traceback.
"""

from __future__ import annotations

import ast
import linecache
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, nbgrader, read


@dataclass(frozen=True)
class Pieces:
    """One function per exercise seam, by the name the exercise gave it; `problems` says which
    of them could not be taken from the learner's notebooks."""

    sample: Callable  # 00: the sampler
    append_slots: Callable  # 02: the block manager
    free: Callable
    allocate: Callable
    paged_decode: Callable  # 03: the decode attention kernel
    admit: Callable  # 04: first come, first served admission
    greedy_accept: Callable  # 05: the rejection sampler
    stochastic_accept: Callable
    quantize_int4: Callable  # 06: INT4 weights
    pack_int4: Callable
    dequantize_int4: Callable
    token_budget: Callable  # 07: the step's token budget under a latency target
    plan_kv_blocks: Callable  # 08: the KV pool's size, and the fused norm of every layer
    fused_add_rms_norm: Callable
    problems: tuple[str, ...] = field(default=())


# The exercise each piece comes from.
EXERCISES = {"sample": "00", "append_slots": "02", "free": "02", "allocate": "02", "paged_decode": "03",
             "admit": "04", "greedy_accept": "05", "stochastic_accept": "05", "quantize_int4": "06",
             "pack_int4": "06", "dequantize_int4": "06", "token_budget": "07", "plan_kv_blocks": "08",
             "fused_add_rms_norm": "08"}


def piece_names() -> list[str]:
    return [f.name for f in fields(Pieces) if f.name != "problems"]


def load_pieces(folder: Path | str = ".") -> Pieces:
    """The learner's pieces from the exercise notebooks NN_*.ipynb in folder."""
    folder = Path(folder)
    if not torch.cuda.is_available():  # as the notebooks do: Triton's interpreter runs kernels on a CPU
        os.environ["TRITON_INTERPRET"] = "1"
    found: dict[str, Callable] = {}
    problems: list[str] = []
    for number in sorted(set(EXERCISES.values())):
        wanted = [name for name, n in EXERCISES.items() if n == number]
        for name, fn in _pieces_of(folder, number, wanted, problems).items():
            found[name] = fn
    for name in piece_names():
        found.setdefault(name, _missing(name))
    return Pieces(**found, problems=tuple(problems))


def _pieces_of(folder: Path, number: str, wanted: list[str], problems: list[str]) -> dict[str, Callable]:
    paths = sorted(folder.glob(f"{number}_*.ipynb"))
    if not paths:
        problems.append(f"{', '.join(wanted)} (exercise {number}): no {number}_*.ipynb beside this notebook, in "
                        f"{folder.resolve()}")
        return {}
    try:
        namespace, unfinished = notebook_answers(paths[0])
    except Exception as e:
        problems.append(f"{', '.join(wanted)} (exercise {number}): the answer cells of {paths[0].name} raised "
                        f"{type(e).__name__}: {e}")
        return {}
    pieces = {}
    for name in wanted:
        fn = namespace.get(name)
        if not callable(fn):
            problems.append(f"{name} (exercise {number}): {paths[0].name} defines no function {name}")
        elif name in unfinished:
            problems.append(f"{name} (exercise {number}) is not implemented yet: its answer cell in {paths[0].name} "
                            "still raises NotImplementedError")
        else:
            pieces[name] = fn
    return pieces


def notebook_answers(path: Path) -> tuple[dict[str, Any], set[str]]:
    """What a notebook's answer cells define, run after the imports of the cells before them; and the names
    defined in an answer cell that still raises NotImplementedError (the cell is what a learner finishes)."""
    namespace: dict[str, Any] = {}
    unfinished: set[str] = set()
    cells = read(path).cells
    last = max((i for i, cell in enumerate(cells) if is_solution(cell) and cell.cell_type == "code"), default=-1)
    for index, cell in enumerate(cells[:last + 1]):  # what comes after the last answer only measures
        if cell.cell_type != "code" or nbgrader(cell).get("grade"):
            continue
        if is_solution(cell):
            tree = ast.parse(cell.source)
            defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
            if any(_raises_not_implemented(n) for n in ast.walk(tree)):
                unfinished |= defined
            _run(cell.source, f"<{path.name}, cell {index}>", namespace)
        else:
            _run(_imports(cell.source), f"<{path.name}, cell {index}, imports>", namespace)
    return namespace, unfinished


def _raises_not_implemented(node: ast.AST) -> bool:
    if not isinstance(node, ast.Raise) or node.exc is None:
        return False
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _imports(source: str) -> str:
    """The import statements of a cell, alone (a cell that is not Python, as the setup cell's `!pip` line, has
    none that count)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    return "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom))


def _run(source: str, filename: str, namespace: dict[str, Any]) -> None:
    # Registered as IPython registers a cell: Triton reads a kernel's source back through linecache.
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)


def _missing(name: str) -> Callable:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise CheckFailed(f"{name} (exercise {EXERCISES[name]}) could not be taken from your notebooks: run "
                          "check_pieces for the reason")
    missing.__name__ = name
    return missing
