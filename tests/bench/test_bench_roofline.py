"""Chapter 08's measurements beside `bench decode`: one matmul timed alone, how busy the device is
while decoding, and the ablation table of the course's techniques (on the shipped model, tiny sizes)."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM
from minillm.bench.ablation import ablation_rows
from minillm.bench.decode import linear_rows
from minillm.bench.utilisation import busy_while_decoding


def test_a_linear_layer_alone_is_charged_its_weight_inputs_and_outputs() -> None:
    rows = linear_rows(256, 1024, (1, 8), torch.float32, "cpu", copy_bw=10e9)
    assert [r["batch"] for r in rows] == [1, 8] and rows[0]["short"] == "linear 1"
    for r in rows:
        moved = 4 * (256 * 1024 + r["batch"] * (256 + 1024))
        assert r["intensity"] == pytest.approx(2 * r["batch"] * 256 * 1024 / moved)
        assert r["GB_s"] * 1e9 / 10e9 == pytest.approx(r["of_copy_bw"])
        assert r["TFLOP_s"] * 1e12 == pytest.approx(r["intensity"] * r["GB_s"] * 1e9)


def test_busy_while_decoding_on_a_cpu() -> None:
    llm = LLM("tiny", device="cpu", skip_tokenizer_init=True, max_num_seqs=2, max_model_len=64, num_kv_blocks=8)
    result = busy_while_decoding(llm, batch=2, context=8, seconds=0.2, max_steps=20)
    assert 1 <= result["steps"] <= 20 and result["step_ms"] > 0
    assert 0 < result["busy"] <= 1 and "as top" in result["measured_by"]
    assert not llm.llm_engine.has_unfinished_requests()  # its requests were aborted


@pytest.mark.slow  # about 15 s alone on 2 cores: a dozen small engines, each timed
def test_the_ablation_table_has_every_row_and_skips_the_gpu_ones_on_a_cpu() -> None:
    rows = ablation_rows("tiny", None, "cpu", large_batch=2, new_tokens=4, long_prompt=64, repeats=1)
    names = [r["technique"] for r in rows]
    assert names == ["KV cache", "paged KV cache", "prefix caching", "chunked prefill", "Triton attention",
                     "CUDA graphs", "INT8 weights, batch 1", "INT8 weights, batch 2", "INT4 weights, batch 1",
                     "INT4 weights, batch 2", "INT8 KV cache", "INT8 KV cache, capacity"]  # no draft model given
    skipped = {r["technique"] for r in rows if r["skipped"]}
    assert skipped == {"Triton attention", "CUDA graphs"}
    for r in rows:
        if r["skipped"] is None:
            assert r["before"] > 0 and r["after"] > 0
            expected = r["after"] / r["before"] if r["higher_is_better"] else r["before"] / r["after"]
            assert r["gain"] == pytest.approx(expected)
    capacity = next(r for r in rows if r["technique"] == "INT8 KV cache, capacity")
    # tiny in float32 on a CPU: 4 bytes per element against 1 byte and a 4-byte scale per 64 elements.
    assert capacity["gain"] == pytest.approx(4 * 64 / 68, rel=0.02)
