"""scripts/gpu_check.sh is wired: on a machine without a GPU it runs dry, every step skipped with
the command it would have run, and writes its summary."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
STEPS = ("env", "tests", "attention", "quant", "model", "decode", "host", "throughput", "spec", "spec-large")


def test_gpu_check_runs_dry_and_names_every_step(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "--dry-run"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "summary.md").read_text()
    for step in STEPS:
        assert f"| {step} | skipped: dry run (would run: " in summary, step
    assert "bench decode" in summary and "tests/kernels/test_gpu.py" in summary


def test_a_subset_of_steps_skips_the_rest_with_the_reason(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path), "--dry-run"], capture_output=True, text=True,
                            timeout=60, env={"GPU_CHECK_STEPS": "tests", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "| tests | skipped: dry run" in summary
    assert "| decode | skipped: not in GPU_CHECK_STEPS |" in summary
