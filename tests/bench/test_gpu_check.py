"""scripts/gpu_check.sh is wired: on a machine without a GPU it runs dry, listing every tier and step
with its estimate and the command it would run; the targets table reads the benchmarks' JSON; the
wheels for the GPU machine download and report their size; the quantized-matmul sweep says it
needs a GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minillm.bench.report import write_json
from minillm.bench.shapes import SHAPES
from minillm.bench.targets import TARGETS, evaluate, format_targets, load_results

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
TIERS = {"1": ("env", "kernels", "attention", "decode", "spec", "throughput", "quant", "decode-int4", "decode-kernels",
          "host", "host-pageable", "host-async", "host-spec", "quant-sweep"),
         "2": ("tests", "notebooks"), "3": ("serve",)}


def dry_run(tmp_path, **env) -> str:
    result = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), str(tmp_path), "--dry-run"], capture_output=True,
                            text=True, timeout=60, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return (tmp_path / "summary.md").read_text()


def test_gpu_check_runs_dry_and_lists_tiers_steps_and_estimates(tmp_path):
    summary = dry_run(tmp_path)
    rows = re.findall(r"^\| (\d) \| ([\w-]+) \| NOT RUN: dry run \(would run: .+\) \| \((\d+)\) \|", summary, re.M)
    assert [(tier, step) for tier, step, _ in rows] == [(t, s) for t, steps in TIERS.items() for s in steps]
    # Two calls of a 10-minute slot, each within the default budget: tiers 1 and 3, then tier 2 (its
    # steps side by side).
    assert sum(int(e) for tier, _, e in rows if tier != "2") <= 540
    assert max(int(e) for tier, _, e in rows if tier == "2") <= 540
    assert "bench kernels" in summary and "tests/kernels/test_gpu.py" in summary and "run_notebooks.py" in summary
    # The decode step ends with the 7B shape, made on the device; the host step has its before.
    decode = next(line for line in summary.splitlines() if line.startswith("| 1 | decode |"))
    assert re.search(r"bench decode --shape (\S+) .*--modes graphs --out \S+/decode-7b\.json", decode)
    assert re.search(r"--shape (\S+)", decode).group(1) in SHAPES
    host = next(line for line in summary.splitlines() if line.startswith("| 1 | host |"))
    assert "bench step" in host and "--baseline d92481a" in host  # this checkout has the history
    for path in re.findall(r"(tests/\S+\.py)", summary):  # every test file it names exists
        assert (SCRIPTS.parent / path).exists(), path


def test_a_dry_run_needs_no_outdir(tmp_path):
    result = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), "--dry-run"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "TMPDIR": str(tmp_path)})  # its scratch folder stays here
    assert result.returncode == 0, result.stderr
    assert "| 1 | env | NOT RUN: dry run" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the sweep runs (step quant-sweep)")
def test_the_quant_sweep_refuses_a_machine_without_a_gpu():
    result = subprocess.run([sys.executable, str(SCRIPTS / "quant_gemv_sweep.py")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert "times kernels on a CUDA GPU; none is visible" in result.stderr


def test_a_subset_or_a_small_budget_leaves_the_rest_not_run_with_the_reason(tmp_path):
    summary = dry_run(tmp_path, GPU_CHECK_STEPS="tests")
    assert "| 2 | tests | NOT RUN: dry run" in summary
    assert "| 1 | decode | NOT RUN: not in GPU_CHECK_STEPS |" in summary
    summary = dry_run(tmp_path, GPU_CHECK_STEPS="tier1 tier3")  # a tier by its name
    assert "| 1 | host-pageable | NOT RUN: dry run" in summary and "| 3 | serve | NOT RUN: dry run" in summary
    assert "| 2 | notebooks | NOT RUN: not in GPU_CHECK_STEPS |" in summary
    pageable = next(line for line in summary.splitlines() if line.startswith("| 1 | host-pageable |"))
    assert "MINILLM_PINNED_STAGING=0" in pageable and "bench step" in pageable


def test_without_git_history_the_host_step_compares_with_the_exported_tree(tmp_path):
    """The GPU machine's copy has no .git: the before comes from the tree gpu_wheels.sh exported, or is
    left out, saying so."""
    wheels = tmp_path / "wheels"
    (wheels / "baseline-d92481a" / "minillm").mkdir(parents=True)
    (wheels / "baseline-d92481a" / "minillm" / "__init__.py").write_text("")
    summary = dry_run(tmp_path / "a", GIT_DIR=str(tmp_path / "no-git"), GPU_CHECK_WHEELS=str(wheels))
    assert f"--baseline {wheels}/baseline-d92481a --out" in summary
    summary = dry_run(tmp_path / "b", GIT_DIR=str(tmp_path / "no-git"), GPU_CHECK_WHEELS=str(tmp_path / "none"))
    host = next(line for line in summary.splitlines() if line.startswith("| 1 | host |"))
    assert "bench step" in host and "--baseline" not in host


def _payload(tmp_path, name: str, rows: list[dict], summary: dict) -> None:
    write_json(tmp_path / f"{name}.json", name, {}, rows, summary)


def test_targets_read_pass_fail_and_not_run_off_the_json(tmp_path):
    _payload(tmp_path, "decode", [{"tokens": 2048, "ms": 11.0}, {"mode": "graphs", "batch": 1}],
             {"batch1_of_copy_bw": 0.3, "graph_capture_s": 4.0, "graph_memory_GiB": 1.5, "batch1_step_ms": 3.0})
    _payload(tmp_path, "decode-int4", [{"mode": "graphs", "batch": 1}], {"batch1_step_ms": 2.5})
    _payload(tmp_path, "decode-7b", [{"mode": "graphs", "batch": 1}], {"batch1_of_copy_bw": 0.8})
    _payload(tmp_path, "kernels", [{"kernel": "torch", "per_layer": 9}, {"kernel": "triton", "per_layer": 12}], {})
    _payload(tmp_path, "spec", [], {"best_k": {"draft_model temp=0.0 batch=1": {"k": 4, "speedup": 2.0,
                                                                                "predicted_speedup": 2.2}}})
    (tmp_path / "notes.json").write_text("[1, 2]")  # not a benchmark's: ignored
    results = load_results(tmp_path)
    table = {row["target"]: row for row in evaluate(results)}
    assert len(table) == len(TARGETS)
    verdicts = {what: row["verdict"] for what, row in table.items()}
    assert verdicts["batch-1 decode of the 1.1B model, CUDA graphs: share of copy bandwidth"] == "FAIL"
    assert verdicts["prefill step of a 2,048-token prompt, 1.1B (ms)"] == "PASS"  # at most 12
    assert verdicts["launches per decoder layer per decode step, tiny, Triton"] == "FAIL"  # the Triton row, 12
    assert verdicts["speculative decoding at batch 1, greedy, tiny + tiny-draft (speedup, best k)"] == "PASS"
    assert abs(table["chapter 05's cost model against the measured speedup (relative error)"]["figure"] - 0.1) < 1e-9
    assert verdicts["continuous over static batching, 64 requests, 1.1B"] == "NOT RUN"  # no throughput.json
    assert verdicts["batch-1 decode of the Llama-2-7B shape, CUDA graphs: share of copy bandwidth"] == "PASS"
    assert verdicts["CUDA graph capture of the 1.1B decode engine, every step shape (s)"] == "PASS"  # at most 10
    assert verdicts["CUDA graph memory of the 1.1B decode engine, every step shape (GiB)"] == "FAIL"  # at most 1
    int4 = table["INT4 g128 decode step over the bf16 step, 1.1B, batch 1, CUDA graphs"]
    assert int4["figure"] == 3.0 / 2.5 and int4["verdict"] == "FAIL"  # the bf16 step over the int4 one, 1.2 < 1.4
    assert int4["source"] == "decode-int4.json over decode.json"
    text = format_targets(list(table.values()), results)
    assert "| batch-1 decode of the 1.1B model, CUDA graphs: share of copy bandwidth | 0.3 | >= 0.55 | FAIL |" in text
    assert text.rstrip().endswith("5 PASS, 4 FAIL, 12 NOT RUN")


def test_the_7b_target_needs_a_graphed_run(tmp_path):
    """A 7B run that could not capture graphs (no Triton) measured eager steps: not the target's figure."""
    _payload(tmp_path, "decode-7b", [{"mode": "eager", "batch": 1}], {"batch1_of_copy_bw": 0.2})
    table = {row["target"]: row for row in evaluate(load_results(tmp_path))}
    assert table["batch-1 decode of the Llama-2-7B shape, CUDA graphs: share of copy bandwidth"]["verdict"] == "NOT RUN"


def test_the_targets_read_what_the_benchmarks_write():
    """Each target's key is one its benchmark's code writes, so a renamed key cannot pass as NOT RUN."""
    sources = {path.stem: path.read_text() for path in (SCRIPTS.parent / "minillm" / "bench").glob("*.py")}
    written = {"decode": "decode", "decode-7b": "decode", "decode-int4": "decode", "kernels": "kernels",
               "kernels-1b": "kernels",
               "attention": "attention",
               "throughput": "throughput", "spec": "spec", "spec-1b": "spec", "quant": "quant_matmul"}
    keys = {"decode": ["batch1_of_copy_bw", "batch1_async_of_copy_bw", '"ms"', '"graph_capture_s"',
                       '"graph_memory_GiB"', '"mode"', '"batch1_step_ms"'],
            "kernels": ['"per_layer"'], "attention": ['"speed_vs_sdpa"'],
            "throughput": ['"continuous_over_static"', '"continuous_over_transformers"'],
            "spec": ['"v"', '"best_k"', '"predicted_speedup"'], "quant_matmul": ['_speedup"]', "in_features"]}
    assert {t.source for t in TARGETS} <= set(written)
    for module, needles in keys.items():
        for needle in needles:
            assert needle in sources[module], (module, needle)
    assert set(written.values()) == set(keys)


def test_the_wheels_script_downloads_and_reports_its_size(tmp_path):
    """The real script against the package index, with one small pure-Python package."""
    result = subprocess.run(["bash", str(SCRIPTS / "gpu_wheels.sh"), str(tmp_path / "w"), "six"], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    assert re.search(r"^1 wheels, 0 MiB in .*/w$", result.stdout, re.M), result.stdout
    assert "install_wheels.py" in result.stdout
    wheels = list((tmp_path / "w").glob("six-*-py2.py3-none-any.whl"))
    assert len(wheels) == 1
    sys.path.insert(0, str(SCRIPTS))
    try:
        from install_wheels import missing
    finally:
        sys.path.remove(str(SCRIPTS))
    fake = tmp_path / "w" / "no_such_distribution-1.0-py3-none-any.whl"
    fake.write_bytes(b"")
    assert missing([wheels[0], fake]) == ([fake] if _has("six") else [wheels[0], fake])


def _has(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False

