"""The `minillm` command, run as a learner would run it: a subprocess, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minillm.cli import main


def minillm(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "minillm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_generate_prints_python_like_text_offline():
    result = minillm("generate", "def fib(n):", "--model", "tiny", "--max-tokens", "64")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("def fib(n):") and len(text) > 60
    assert any(word in text for word in ("return", "if ", "self", "for ")), text


def test_generate_streams():
    result = minillm("generate", "import os", "--model", "tiny", "--max-tokens", "16", "--stream")
    assert result.returncode == 0 and result.stdout.startswith("import os"), result.stderr


def test_bad_input_is_a_one_line_error_not_a_traceback():
    result = minillm("generate", "x", "--model", "tiny", "--top-p", "1.5")
    assert result.returncode == 2
    assert "top_p must be in (0, 1], got 1.5" in result.stderr and "Traceback" not in result.stderr
    result = minillm("generate", "x", "--model", "no-such-model")
    assert result.returncode == 2 and "unknown model 'no-such-model'" in result.stderr


def test_bad_values_are_refused_before_a_model_loads(tmp_path, monkeypatch, capsys):
    """Loading a model takes seconds to minutes: every value the command line can check is checked first."""
    import minillm

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(minillm, "LLM", no_model)
    (tmp_path / "config.json").write_text("{}")
    cases = [(["generate", "x", "--temperature", "-1"], "temperature must be"),
             (["generate", "x", "--max-tokens", "0"], "--max-tokens: the value must be an integer >= 1, got 0"),
             (["quantize", "--quantization", "int8", "--output", str(tmp_path)], "already holds a model"),
             (["eval", "perplexity", "--window", "0"], "argument --window"),
             (["eval", "acceptance", "-k", "-2"], "argument -k"),
             (["bench", "decode", "--steps", "zero"], "must be an integer, got 'zero'"),
             (["bench", "attention", "--tilings", "64x32x8", "64x48x8"], "argument --tilings: must be powers of two"),
             (["bench", "attention", "--tilings", "64x32"], "must be BLOCK_MxBLOCK_NxWARPS[xSTAGES], e.g. 64x32x8, "
                                                            "got '64x32'"),
             (["bench", "attention", "--tilings", "64x32x4x9"], "stages must be 1 to 6, got '64x32x4x9'"),
             (["serve", "tiny", "--port", "70000"], "argument --port: the value must be an integer in [0, 65535]"),
             (["serve", "tiny", "--max-body-bytes", "0"], "argument --max-body-bytes")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2, argv
        assert message in capsys.readouterr().err, argv


def test_serve_hands_the_scheduling_policy_to_the_engine():
    """A name the engine does not know is refused by the engine itself, before the model loads."""
    result = minillm("serve", "tiny", "--port", "0", "--scheduling-policy", "priority")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "minillm: error: scheduling_policy must be one of ('fcfs',)" in result.stderr
    assert "got 'priority'" in result.stderr


def test_env_reports_versions_and_triton():
    result = minillm("env", "--json")
    info = json.loads(result.stdout)
    assert info["packages"]["torch"] and info["default_device"] in ("cpu", "cuda", "mps")
    assert isinstance(info["triton_status"], str) and isinstance(info["triton_usable"], bool)
    assert info["packages"]["torch"] == torch.__version__  # with its build tag (+cpu, +cu130)
    text = minillm("env").stdout
    assert "torch" in text and len([line for line in text.splitlines() if line.split()[0] == "triton"]) <= 1


@pytest.mark.slow
def test_bench_kv_cache_writes_json(tmp_path):
    out = tmp_path / "kv.json"
    result = minillm("bench", "kv-cache", "--lengths", "32", "128", "--decode-tokens", "8", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "cached tok/s" in result.stdout
    payload = json.loads(out.read_text())
    assert [r["context"] for r in payload["rows"]] == [32, 128]
    # Speed is the benchmark's business (BENCHMARKS.md); the test checks the report and that both
    # engines produced the same tokens.
    assert all(r["same_tokens"] and r["cached_tok_s"] > 0 and r["recompute_tok_s"] > 0 for r in payload["rows"])
    assert payload["environment"]["packages"]["torch"]


@pytest.mark.slow
def test_bench_paged_writes_json(tmp_path):
    out = tmp_path / "paged.json"
    result = minillm("bench", "paged", "--num-requests", "6", "--max-tokens", "64", "--budget-blocks", "40",
                     "--prefix-requests", "4", "--prefix-len", "48", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "KV used / reserved" in result.stdout and "prefill tokens computed" in result.stdout
    summary = json.loads(out.read_text())["summary"]
    assert summary["memory"]["all_outputs_identical"] and summary["prefix_cache"]["all_outputs_identical"]
    # Paging reserves at most one partly filled block per sequence beyond what it uses.
    assert summary["memory"]["paged_kv_utilisation"] > summary["memory"]["contiguous_kv_utilisation"]
    assert summary["prefix_cache"]["prefill_tokens_saved"] > 0.5


@pytest.mark.slow
def test_bench_throughput_writes_json(tmp_path):
    out = tmp_path / "throughput.json"
    result = minillm("bench", "throughput", "--num-requests", "6", "--batch-size", "2", "--max-prompt", "24",
                     "--max-output", "16", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "TTFT p50 ms" in result.stdout and "transformers generate" in result.stdout
    payload = json.loads(out.read_text())
    rows = {r["system"]: r for r in payload["rows"]}
    assert set(rows) == {"minillm continuous", "minillm static", "minillm static, draining",
                         "transformers generate"}
    # Every system generated every request's tokens; minillm's static schedules the same ones as continuous.
    assert len({r["output_tokens"] for r in rows.values()}) == 1
    assert rows["minillm static"]["same_tokens"] == rows["minillm static, draining"]["same_tokens"] == "6/6"
    assert all(r["tpot_p95_ms"] >= r["tpot_p50_ms"] > 0 and r["ttft_p95_ms"] >= r["ttft_p50_ms"] > 0
               for r in rows.values())


def test_bench_quant_writes_json(tmp_path):
    out = tmp_path / "quant.json"
    result = minillm("bench", "quant", "--device", "cpu", "--max-eval-tokens", "1024", "--num-prompts", "2",
                     "--num-tokens", "4", "--group-sizes", "64", "128", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "linear weight bytes" in result.stdout and "no CUDA device" in result.stdout
    rows = json.loads(out.read_text())["rows"]
    weights = [(r["quantization"], r["group_size"]) for r in rows if "quantization" in r]
    assert weights == [("none", None), ("int8", None), ("int4", 64), ("int4", 128)]
    kv = {r["kv_cache_dtype"]: r for r in rows if "kv_cache_dtype" in r}
    # Scales and zero points are counted: int4 with smaller groups holds more bytes.
    bytes_vs_fp16 = [r["bytes_vs_fp16"] for r in rows if "quantization" in r]
    assert bytes_vs_fp16[0] == 2.0 and 0.5 < bytes_vs_fp16[1] < 0.53 and bytes_vs_fp16[2] > bytes_vs_fp16[3]
    assert kv["int8"]["kv_bytes_per_token"] * 2 < kv["auto"]["kv_bytes_per_token"]


@pytest.mark.slow
def test_a_random_llama_checkpoint_serves_the_throughput_benchmark(tmp_path):
    """The GPU run's model: scripts/random_llama.py (here at toy size) and the benchmark pointed at it."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "random_llama.py"
    made = subprocess.run([sys.executable, str(script), str(tmp_path / "llama"), "--hidden", "64", "--layers", "2",
                           "--heads", "4", "--kv-heads", "2", "--intermediate", "128", "--vocab", "5000"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "llama" / "model.safetensors").exists() and (tmp_path / "llama" / "tokenizer.json").exists()
    out = tmp_path / "throughput.json"
    result = minillm("bench", "throughput", "--model", str(tmp_path / "llama"), "--num-requests", "4", "--batch-size",
                     "2", "--max-prompt", "16", "--max-output", "8", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["rows"][1]["same_tokens"] == "4/4"
