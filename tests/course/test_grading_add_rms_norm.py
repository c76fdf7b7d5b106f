"""Exercise 08, part 5: the checks pass the solution's fused add+RMSNorm kernel, name each usual
mistake (variance in the input dtype, the cast in the wrong order, eps outside the root, the
residual not updated), and the engine check runs the kernel in every layer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from minillm.grading import checks_add_rms_norm as checks
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read

pytest.importorskip("triton")

SOLUTION = Path(__file__).resolve().parents[2] / "solutions" / "08_the_engine_on_a_gpu.ipynb"
IMPORTS = "import torch\nimport triton\nimport triton.language as tl\n\n"


def solution_source() -> str:
    (cell,) = [c for c in read(SOLUTION).cells
               if is_solution(c) and c.metadata["nbgrader"]["grade_id"] == "fused-add-rms-norm-solution"]
    return cell.source


def launcher(tmp_path: Path, old: str = "", new: str = "", name: str = "solution"):
    """The solution cell's launcher, its kernel mutated: Triton reads a kernel's source from its file."""
    source = solution_source()
    assert old in source, old
    path = tmp_path / f"{name}.py"
    path.write_text(IMPORTS + source.replace(old, new))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fused_add_rms_norm


def test_check_passes_the_solution(tmp_path, capsys):
    checks.check_fused_add_rms_norm(launcher(tmp_path))
    assert "check_fused_add_rms_norm passed" in capsys.readouterr().out


@pytest.mark.parametrize("old, new, message", [
    ("variance = tl.sum(t32 * t32, axis=0) / dim", "variance = tl.sum(total * total, axis=0).to(tl.float32) / dim",
     "only the fp16 rows of values in the hundreds are wrong(?s:.*)float32"),
    ("(w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)",
     "(w.to(tl.float32) * (t32 * tl.rsqrt(variance + eps))).to(x.dtype)",
     "round differently from the reference(?s:.*)cast the normalised row back"),
    ("tl.rsqrt(variance + eps)", "(tl.rsqrt(variance) + eps)", "rows of tiny values are far off(?s:.*)inside the root"),
    ("tl.store(residual_out_ptr + row * dim + offs, total, mask=mask)",
     "tl.store(residual_out_ptr + row * dim + offs, r, mask=mask)", "the residual returned is not x \\+ residual"),
], ids=["variance-in-input-dtype", "cast-order", "eps-outside-the-root", "residual-not-updated"])
def test_check_names_the_mistake(tmp_path, old, new, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_fused_add_rms_norm(launcher(tmp_path, old, new, "wrong"))


def test_engine_check_passes_the_solution_and_fails_a_wrong_kernel(tmp_path, capsys):
    checks.check_engine(launcher(tmp_path), "tiny", "cpu")
    assert "check_engine passed: with your kernel in every decoder layer" in capsys.readouterr().out
    # The residual stream never grows past the embeddings: the tokens change at once.
    wrong = launcher(tmp_path, "tl.store(residual_out_ptr + row * dim + offs, total, mask=mask)",
                     "tl.store(residual_out_ptr + row * dim + offs, r, mask=mask)", "wrong")
    with pytest.raises(CheckFailed, match="fused_add_rms_norm"):
        checks.check_engine(wrong, "tiny", "cpu")
