"""The chapters' GPU branches run on the CPU: the cells that branch on the GPU, and the cells they
depend on, execute with a CPU standing in for a CUDA GPU ($MINILLM_GPU_STANDIN=1, see
minillm/course/gpu_standin.py), so that a misspelt name, argument or key in a branch that CI's CPU
never takes fails here. One process for them all, a namespace per notebook; what the cells print is not
checked."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

from IPython.core.inputtransformer2 import TransformerManager

from minillm.grading.notebook import read
from minillm.utils.device import GPU_STANDIN_ENV

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ["notebooks/03_triton_attention.ipynb", "notebooks/06_quantization.ipynb",
            "notebooks/08_the_engine_on_a_gpu.ipynb", "solutions/03_triton_attention.ipynb",
            "solutions/08_the_engine_on_a_gpu.ipynb"]
BRANCH = re.compile(r"\bon_gpu\b|torch\.cuda\.is_available\(\)|\bDEVICE == \"cuda\"")
# Sizes that a branch's own text sets at a GPU's scale, run at a CPU's: (the text, what it becomes, in
# every cell that runs).
SCALED = {"notebooks/03_triton_attention.ipynb": [("(2048, 4096, 8192) if DEVICE", "(64, 128, 256) if DEVICE")],
          "solutions/03_triton_attention.ipynb": [
              ("paged_inputs(batch, 4096", "paged_inputs(batch, 256"), ("max_seq_len=4096", "max_seq_len=256"),
              ("for batch in (1, 64)", "for batch in (1, 2)"), ("for size in (512, 4096)", "for size in (64, 256)"),
              ("ms[512]", "ms[64]"), ("ms[4096]", "ms[256]")],
          "notebooks/08_the_engine_on_a_gpu.ipynb": [("for i in range(16)]", "for i in range(2)]"),
                                                     ("for _ in range(3):", "for _ in range(1):")]}
# Cells left out, with what they depend on: the course's whole ablation table takes minutes, and the
# branch that reads it (which conclusion to print) has nothing GPU-only to run.
TOO_SLOW = re.compile(r"\bablation_rows\(")


def _python(source: str) -> str:
    return TransformerManager().transform_cell(source)  # `!pip` and the like, as IPython runs them


def _names(source: str) -> tuple[set[str], set[str]]:
    """The top-level names a cell defines, and the names it reads."""
    tree = ast.parse(_python(source))
    defined, read_names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (defined if isinstance(node.ctx, ast.Store) else read_names).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return defined, read_names


def branch_cells(notebook: Path) -> tuple[list[int], list[int]]:
    """The code cells to run (the branch cells and, before them, the last cell that defines each name
    they read, transitively, in notebook order), and the branch cells among them."""
    cells = [(i, cell.source) for i, cell in enumerate(read(notebook).cells) if cell.cell_type == "code"]
    names = {i: _names(source) for i, source in cells}
    slow = {i for i, source in cells if TOO_SLOW.search(source)}
    branches = [i for i, source in cells if BRANCH.search(source)]
    chosen: set[int] = set()
    todo = list(branches)
    while todo:
        i = todo.pop()
        if i in chosen:
            continue
        chosen.add(i)
        for name in names[i][1] - names[i][0]:
            source = next((j for j, _ in reversed(cells) if j < i and name in names[j][0]), None)
            if source is not None:
                todo.append(source)
    # A cell that needs a slow one is left out, and so is the slow one.
    left_out = {i for i in chosen if i in slow}
    changed = True
    while changed:
        changed = False
        for i in sorted(chosen - left_out):
            if any(name in names[j][0] for j in left_out for name in names[i][1] - names[i][0]):
                left_out.add(i)
                changed = True
    run = sorted((chosen - left_out) | {cells[0][0]})  # the setup cell: setup() makes the CPU stand in
    return run, [i for i in branches if i in run]


def run_cells(notebook: str, cells: list[int]) -> None:
    """In this process, with the CPU standing in for a GPU: the cells, in order, in one namespace."""
    sources = [cell.source for cell in read(Path(notebook)).cells]
    for gpu_scale, cpu_scale in SCALED.get(notebook, []):
        if not any(gpu_scale in sources[i] for i in cells):
            sys.exit(f"{notebook}: no cell to run holds {gpu_scale!r} any more: update SCALED")
        for i in cells:
            sources[i] = sources[i].replace(gpu_scale, cpu_scale)
    namespace: dict = {"__name__": "__main__"}
    for i in cells:
        start = time.perf_counter()
        try:
            exec(compile(_python(sources[i]), f"{notebook} cell {i}", "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            sys.exit(f"{notebook}: cell {i} failed")
        print(f"{notebook} cell {i}: {time.perf_counter() - start:.1f} s", file=sys.stderr)


def test_gpu_branches_run_on_a_cpu_standing_in_for_a_gpu():
    """All three chapters in one process (torch is imported once), each in a namespace of its own."""
    runs = {}
    for notebook in CHAPTERS:
        cells, branches = branch_cells(ROOT / notebook)
        assert branches, f"{notebook} has no GPU branch left to run"
        runs[notebook] = ",".join(map(str, cells))
    env = {**os.environ, GPU_STANDIN_ENV: "1", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PLOTLY_RENDERER": "json", "MINILLM_MODEL": "tiny", "MINILLM_DRAFT_MODEL": "tiny-draft"}
    result = subprocess.run([sys.executable, __file__, *(f"{nb}:{cells}" for nb, cells in runs.items())], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    # Each chapter's setup did take the GPU's side.
    assert result.stdout.count("CourseSetup(device='cuda'") == len(CHAPTERS), result.stdout[-3000:]


if __name__ == "__main__":
    for run in sys.argv[1:]:
        notebook, cells = run.split(":")
        run_cells(notebook, [int(i) for i in cells.split(",")])
