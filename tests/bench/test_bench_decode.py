"""`minillm bench decode`: the bytes and flops it charges a step with, and the table it prints."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_hf_model
from test_cli import minillm

from minillm import LLM
from minillm.bench.decode import weight_bytes


@pytest.mark.parametrize("kind", ["llama_mha", "llama_gqa_tied"])
def test_weight_bytes_count_what_a_decode_step_reads(kind, tmp_path):
    hf = make_hf_model(kind)
    hf.save_pretrained(tmp_path)
    model = LLM(str(tmp_path), skip_tokenizer_init=True, dtype="float32", device="cpu").llm_engine.model
    params = {name: p.numel() for name, p in hf.named_parameters()}
    embed = params["model.embed_tokens.weight"]
    norms = sum(n for name, n in params.items() if "norm" in name)
    read, linear = weight_bytes(model)
    # An untied embedding table is only looked up (a row per token); a tied one is the output head.
    assert read == 4 * (sum(params.values()) - (0 if hf.config.tie_word_embeddings else embed))
    assert linear == sum(params.values()) - norms - (0 if hf.config.tie_word_embeddings else embed)


def test_bench_decode_prints_the_roofline(tmp_path):
    out = tmp_path / "decode.json"
    result = minillm("bench", "decode", "--model", "tiny", "--batches", "1", "8", "--context", "32", "--steps", "3",
                     "--prefill-lens", "64", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "of copy bw" in result.stdout and "time to first token" in result.stdout
    payload = json.loads(out.read_text())
    decode = [r for r in payload["rows"] if "batch" in r]
    modes = ["eager", "graphs"] if torch.cuda.is_available() else ["eager"]  # CUDA graphs need CUDA
    assert [(r["mode"], r["batch"]) for r in decode] == [(m, b) for m in modes for b in (1, 8)]
    summary = payload["summary"]
    assert summary["copy_GB_s"] > 0 and summary["matmul_TFLOP_s"] > 0 and summary["read_GB_s"] > 0
    # The same batch-1 step against the two roofs: its bytes per second over each.
    one = decode[-2] if torch.cuda.is_available() else decode[0]
    assert summary["batch1_of_read_bw"] == pytest.approx(one["GB_s"] / summary["read_GB_s"])
    prefill = [r for r in payload["rows"] if "tokens" in r]
    assert [(r["mode"], r["tokens"]) for r in prefill] == [(m, 64) for m in modes]
    # One sequence does about 2 flops per weight of 2 or 4 bytes: far below any machine's ridge point.
    assert decode[0]["bound"] == "memory" and decode[0]["intensity"] < 1.2
    assert decode[1]["intensity"] > 4 * decode[0]["intensity"]
