"""`minillm bench decode`: the bytes and flops it charges a step with, the steps it times, and the
table it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_hf_model
from test_cli import minillm

from minillm import LLM
from minillm.bench import random_llama
from minillm.bench.decode import decode_step_bytes, weight_bytes
from minillm.bench.engine_steps import decode_len, decode_step_seconds
from minillm.bench.random_llama import llama_config, write_llama_config
from minillm.bench.shapes import SHAPES
from minillm.cli import main
from minillm.engine.trace import record
from minillm.models.registry import model_config_from_hf


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


@pytest.mark.parametrize("batch", [8, 16, 24])
def test_every_timed_step_decodes_the_whole_batch(batch):
    """64-token prompts prefilled 32 tokens a step, less what the decodes of the first ones take (the
    scheduler serves decodes first: at 24 sequences, 8 prompt tokens a step); those first ones must
    not finish before the timed steps are over (they did: steps of "64 sequences" of 512 tokens ran
    60 down to 25 of them)."""
    context, steps = 64, 4
    longest = decode_len(batch, context, steps, 32)
    llm = LLM("tiny", device="cpu", skip_tokenizer_init=True, max_num_batched_tokens=32, max_model_len=longest,
              max_num_seqs=batch)
    with record(llm) as trace:
        runs, replay, length = decode_step_seconds(llm, batch, context, steps)
    assert len(runs) == steps and replay is None
    assert [len(event.seqs) for event in trace.events[-steps:]] == [batch] * steps
    assert context + 1 < length < longest
    with pytest.raises(ValueError, match=f"max_model_len >= {longest}"):
        decode_step_seconds(LLM("tiny", device="cpu", skip_tokenizer_init=True, max_num_batched_tokens=32,
                                max_model_len=longest - 1, max_num_seqs=batch), batch, context, steps)


def test_bench_decode_prints_the_roofline(tmp_path):
    out = tmp_path / "decode.json"
    result = minillm("bench", "decode", "--model", "tiny", "--batches", "1", "8", "--context", "32", "--steps", "3",
                     "--prefill-lens", "64", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "of copy bw" in result.stdout and "time to first token" in result.stdout
    payload = json.loads(out.read_text())
    decode = [r for r in payload["rows"] if "batch" in r]
    modes = ["eager", "graphs"] if torch.cuda.is_available() else ["eager"]  # CUDA graphs need CUDA
    # Async scheduling changes decode steps alone.
    decode_modes = modes + ["async"] if torch.cuda.is_available() else modes
    assert [(r["mode"], r["batch"]) for r in decode] == [(m, b) for m in decode_modes for b in (1, 8)]
    summary = payload["summary"]
    assert summary["copy_GB_s"] > 0 and summary["matmul_TFLOP_s"] > 0 and summary["read_GB_s"] > 0
    # The same batch-1 step against the two roofs: its bytes per second over each.
    one = decode[2] if torch.cuda.is_available() else decode[0]
    assert summary["batch1_of_read_bw"] == pytest.approx(one["GB_s"] / summary["read_GB_s"])
    assert (summary["batch1_async_of_copy_bw"] is not None) == torch.cuda.is_available()
    prefill = [r for r in payload["rows"] if "tokens" in r]
    assert [(r["mode"], r["tokens"]) for r in prefill] == [(m, 64) for m in modes]
    # One sequence does about 2 flops per weight of 2 or 4 bytes: far below any machine's ridge point.
    assert decode[0]["bound"] == "memory" and decode[0]["intensity"] < 1.2
    assert decode[1]["intensity"] > 4 * decode[0]["intensity"]


def test_a_shape_decodes_from_random_weights_made_on_the_device(tmp_path, monkeypatch):
    """`--shape`'s path (llama-2-7b on a GPU) at a toy size: only config.json is written, the weights
    are load_format="dummy"'s, and the step is charged the shape's bytes against both roofs."""
    toy = dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512)
    monkeypatch.setitem(SHAPES, "toy", toy)
    written = []

    def spy(folder, **shape) -> Path:
        path = write_llama_config(folder, **shape)
        written.append((shape, sorted(p.name for p in path.iterdir())))
        return path

    monkeypatch.setattr(random_llama, "write_llama_config", spy)
    out = tmp_path / "decode.json"
    main(["bench", "decode", "--shape", "toy", "--device", "cpu", "--dtype", "float32", "--batches", "1",
          "--context", "16", "--steps", "3", "--prefill-lens", "--modes", "graphs", "--out", str(out)])
    assert written == [(toy, ["config.json"])]  # no weights on disk
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    summary = payload["summary"]
    assert row["mode"] == "eager"  # no graphs on a CPU: labelled by what ran
    config = model_config_from_hf(llama_config(**toy).to_dict())
    # Timing begins with the prompt and two tokens decoded; a step is charged the K/V of the middle one.
    assert row["GB_per_step"] * 1e9 == pytest.approx(decode_step_bytes(config, 1, 16 + 2 + 3 // 2, torch.float32))
    assert summary["batch1_of_copy_bw"] == pytest.approx(row["GB_s"] / summary["copy_GB_s"])
    assert summary["batch1_of_read_bw"] == pytest.approx(row["GB_s"] / summary["read_GB_s"])
    assert summary["graph_capture_s"] is None and summary["graph_memory_GiB"] is None  # nothing captured


def test_dummy_weights_are_random_small_and_on_the_device(tmp_path):
    write_llama_config(tmp_path, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=512)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    args = dict(skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64, num_kv_blocks=4)
    engine = LLM(str(tmp_path), load_format="dummy", **args).llm_engine
    for name, param in engine.model.named_parameters():
        assert param.dtype == torch.float32 and param.abs().max() <= 1e-3, name
        assert param.std() > 1e-4, name  # drawn, not left as to_empty's memory or zeros
    again = LLM(str(tmp_path), load_format="dummy", **args).llm_engine
    assert torch.equal(again.model.lm_head.weight, engine.model.lm_head.weight)  # seeded
    with pytest.raises(ValueError, match="load_format must be one of"):
        LLM(str(tmp_path), load_format="pt", **args)
    with pytest.raises(ValueError, match="load_format='dummy'.*quantization='int8'"):
        LLM(str(tmp_path), load_format="dummy", quantization="int8", **args)
    with pytest.raises(ValueError, match="no \\*.safetensors weight files"):  # the default reads the checkpoint
        LLM(str(tmp_path), **args)


def test_a_quantized_model_is_charged_its_quantized_bytes(tmp_path):
    """`--quantization int4` (the GPU check's whole INT4 step): the step reads the packed weights,
    their scales and zero points, and the layers left in the model's dtype, not the model's bytes."""
    payloads = {}
    for method in ("none", "int4"):
        out = tmp_path / f"{method}.json"
        main(["bench", "decode", "--model", "tiny", "--device", "cpu", "--dtype", "float32", "--batches", "1",
              "--context", "16", "--steps", "3", "--prefill-lens", "--out", str(out)]
             + ([] if method == "none" else ["--quantization", method]))
        payloads[method] = json.loads(out.read_text())
    assert payloads["none"]["summary"]["quantization"] is None
    assert payloads["int4"]["summary"]["quantization"] == "int4"
    engine = LLM("tiny", device="cpu", dtype="float32", skip_tokenizer_init=True, quantization="int4").llm_engine
    assert payloads["int4"]["summary"]["weight_GB"] * 1e9 == weight_bytes(engine.model)[0]
    assert payloads["int4"]["summary"]["weight_GB"] < 0.5 * payloads["none"]["summary"]["weight_GB"]
    for payload in payloads.values():
        assert payload["summary"]["batch1_step_ms"] == payload["rows"][0]["step_ms"]
