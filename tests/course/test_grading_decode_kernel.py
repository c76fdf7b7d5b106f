"""Exercise 03's checks: they pass the solution, name common mistakes in the tile loop and in the
split-KV merge, refuse the untouched exercise, and the engine checks leave the engine's own kernel in
place."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from minillm import LLM
from minillm.grading import checks_decode_kernel as checks
from minillm.grading import checks_split_kv
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read
from minillm.kernels import attention_reference

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "03_triton_attention.ipynb"
IMPORTS = """import torch
import triton
import triton.language as tl

from minillm.kernels import dot_precision
from minillm.kernels.tiles import load_kv_tile
"""


def solution_source(grade_id: str = "decode-kernel-solution") -> str:
    (cell,) = [c for c in read(SOLUTION).cells if is_solution(c) and c.metadata["nbgrader"]["grade_id"] == grade_id]
    return cell.source


def merge_solution():
    """The solution's `merge_partitions`, run from the notebook's own source."""
    namespace = {"torch": torch}
    exec(solution_source("merge-solution"), namespace)
    return namespace["merge_partitions"]


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


# The interpreter warns as the overflow these kernels are written to make happens.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("changes", [
    # exp(scores) with no max subtracted, and nothing to rescale: exact for small scores, inf for large ones
    [("p = tl.exp(scores - m_new[:, None])", "p = tl.exp(scores)"),
     ("alpha = tl.exp(m - m_new)", "alpha = tl.full([GROUP_PAD], 1.0, tl.float32)")],
    # the max of this tile alone: exact for small scores, but exp(m - m_new) overflows after a lower tile
    [("m_new = tl.maximum(m, tl.max(scores, 1))", "m_new = tl.max(scores, 1)")],
], ids=["no-max-subtracted", "max-of-the-tile-alone"])
def test_check_names_an_exp_that_overflows_on_large_scores(tmp_path, changes):
    source = solution_source()
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    with pytest.raises(CheckFailed, match=r"queries scaled by 100(?s:.*)overflow exp\(\) in float32"):
        checks.check_decode_kernel(kernel(tmp_path, source, "overflows"))


@pytest.mark.slow
def test_engine_check_passes_the_solution_fails_a_wrong_kernel_and_restores_the_engine(tmp_path, capsys):
    llm = LLM("tiny", dtype="float32")
    ops = llm.llm_engine.model_runner.attn_backend.ops
    own = ops.paged_decode_attention
    checks.check_engine(kernel(tmp_path, solution_source(), "solution"), llm)
    assert "check_engine passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="with your paged_decode in the engine"):
        checks.check_engine(mutated(tmp_path, "* scale\n", "\n", "wrong"), llm)
    assert ops.paged_decode_attention is own is attention_reference.paged_decode_attention_ref


def test_merge_check_passes_the_solution(capsys):
    checks_split_kv.check_merge(merge_solution())
    assert "check_merge passed" in capsys.readouterr().out


def _weighted(weights, part_out):
    return (weights[..., None] * part_out).sum(2) / weights.sum(2)[..., None]


def _shifted(lse):
    return torch.exp(lse - lse.amax(2, keepdim=True))


# One wrong merge per usual mistake, and what the check must say about it.
WRONG_MERGES = {
    "averages-the-outputs": (lambda part_out, lse: part_out.mean(2), "averaged"),
    "no-max-shift": (lambda part_out, lse: _weighted(lse.exp(), part_out), "overflows(?s:.*)largest lse"),
    "not-normalized": (lambda part_out, lse: (_shifted(lse)[..., None] * part_out).sum(2), "not divided by their sum"),
    "reversed-rescale": (lambda part_out, lse: _weighted(torch.exp(lse.amax(2, keepdim=True) - lse), part_out),
                         "reversed"),
    "max-over-the-batch": (lambda part_out, lse: _weighted(torch.exp(lse - lse.max()), part_out),
                           "underflows(?s:.*)not over the whole tensor"),
    "empty-partitions-weigh": (lambda part_out, lse: merge_solution()(part_out, lse.nan_to_num(neginf=0.0)),
                               "past the end(?s:.*)leave -inf"),
    "nan-for-a-row-without-keys": (lambda part_out, lse: (torch.softmax(lse, 2)[..., None] * part_out).sum(2),
                                   "length 0(?s:.*)must be 0"),
}


@pytest.mark.parametrize("name", WRONG_MERGES)
def test_merge_check_names_the_mistake(name):
    merge, message = WRONG_MERGES[name]
    with pytest.raises(CheckFailed, match=message):
        checks_split_kv.check_merge(merge)


def test_merge_check_refuses_the_stub_and_a_wrong_shape():
    def stub(part_out, lse):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not implemented yet"):
        checks_split_kv.check_merge(stub)
    with pytest.raises(CheckFailed, match="expected a float32 tensor of shape"):
        checks_split_kv.check_merge(lambda part_out, lse: part_out.sum(3))


@pytest.mark.slow
def test_merge_engine_check_passes_the_solution_fails_a_wrong_merge_and_restores_the_engine(capsys):
    llm = LLM("tiny", dtype="float32")
    ops = llm.llm_engine.model_runner.attn_backend.ops
    checks_split_kv.check_merge_engine(merge_solution(), llm)
    assert "check_merge_engine passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="with your merge_partitions in the engine"):
        checks_split_kv.check_merge_engine(lambda part_out, lse: part_out.mean(2), llm)
    assert ops.paged_decode_attention is attention_reference.paged_decode_attention_ref
