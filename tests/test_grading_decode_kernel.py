"""Exercise 03's checks: they pass the solution, name common mistakes in the tile loop, refuse the
untouched exercise, and the engine check leaves the engine's own kernel in place."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from minillm import LLM
from minillm.grading import checks_decode_kernel as checks
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read
from minillm.kernels import reference

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "03_triton_attention.ipynb"
IMPORTS = """import torch
import triton
import triton.language as tl

from minillm.kernels import dot_precision
from minillm.kernels.tiles import load_kv_tile
"""


def solution_source() -> str:
    return "\n".join(c.source for c in read(SOLUTION).cells if is_solution(c))


def kernel(tmp_path: Path, source: str, name: str):
    """`paged_decode` from source written to a module: Triton reads a kernel's source from its file."""
    path = tmp_path / f"{name}.py"
    path.write_text(IMPORTS + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.paged_decode


def mutated(tmp_path: Path, old: str, new: str, name: str):
    source = solution_source()
    assert old in source, old
    return kernel(tmp_path, source.replace(old, new), name)


def test_check_passes_the_solution(tmp_path, capsys):
    checks.check_decode_kernel(kernel(tmp_path, solution_source(), "solution"))
    assert "check_decode_kernel passed" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, message", [
    ("acc = acc * alpha[:, None] +", "acc = acc +", "sequences of one tile are right(?s:.*)exp\\(m_old - m_new\\)"),
    ("m = m_new", "m = m", "sequences of one tile are right"),
    ("scores = tl.where(mask_t[None, :], scores, float(\"-inf\"))", "",
     "lengths that fill whole tiles are right(?s:.*)-inf"),
    ("* scale\n", "\n", "even a single tile is wrong"),
], ids=["no-rescale-of-acc", "max-not-kept", "no-tail-mask", "no-scale"])
def test_check_names_the_mistake(tmp_path, old, new, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_decode_kernel(mutated(tmp_path, old, new, "wrong"))


@pytest.mark.slow
def test_engine_check_passes_the_solution_fails_a_wrong_kernel_and_restores_the_engine(tmp_path, capsys):
    llm = LLM("tiny", dtype="float32")
    ops = llm.llm_engine.model_runner.attn_backend.ops
    own = ops.paged_decode_attention
    checks.check_engine(kernel(tmp_path, solution_source(), "solution"), llm)
    assert "check_engine passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="with your paged_decode in the engine"):
        checks.check_engine(mutated(tmp_path, "* scale\n", "\n", "wrong"), llm)
    assert ops.paged_decode_attention is own is reference.paged_decode_attention_ref
