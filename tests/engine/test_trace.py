"""Trace events say exactly what the engine did in each step."""

from __future__ import annotations

import pytest

from minillm import LLM, SamplingParams
from minillm.engine.trace import record


@pytest.fixture(scope="module")
def llm(hf_checkpoint):
    return LLM(str(hf_checkpoint("llama_gqa_tied")[1]), skip_tokenizer_init=True, kv_cache="contiguous")


def test_events_for_a_contiguous_cache(llm):
    params = [SamplingParams(max_tokens=3, ignore_eos=True), SamplingParams(max_tokens=5, ignore_eos=True)]
    with record(llm) as trace:
        llm.generate([{"prompt_token_ids": [1] * 7}, {"prompt_token_ids": [2] * 4}], params, use_tqdm=False)
    assert len(trace.events) == 5 and [e.step for e in trace.events] == list(range(
        trace.events[0].step, trace.events[0].step + 5))
    first, second = trace.events[0], trace.events[1]
    assert [(s.prefill_tokens, s.decode_tokens, s.kv_tokens, s.kv_reserved_tokens) for s in first.seqs] == [
        (7, 0, 7, 10), (4, 0, 4, 9)]
    assert [(s.prefill_tokens, s.decode_tokens, s.kv_tokens) for s in second.seqs] == [(0, 1, 8), (0, 1, 5)]
    assert [s.finish_reason for s in trace.events[2].seqs] == ["length", None]
    assert [s.request_id for s in trace.events[3].seqs] == [trace.request_ids[1]]
    assert trace.events[-1].seqs[0].finish_reason == "length" and trace.events[-1].kv_tokens == 8
    info = trace.info
    assert info.kv_cache == "contiguous" and info.kv_bytes_per_token == 2 * 2 * 2 * 8 * 4
    assert "steps=5, requests=2" in repr(trace)


def test_events_for_a_paged_cache_show_blocks_and_prefix_hits(hf_checkpoint):
    llm = LLM(str(hf_checkpoint("llama_gqa_tied")[1]), skip_tokenizer_init=True, block_size=4, num_kv_blocks=16,
              max_model_len=32)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    with record(llm) as trace:
        llm.generate({"prompt_token_ids": [1] * 9}, params, use_tqdm=False)
        again = llm.generate({"prompt_token_ids": [1] * 9}, params, use_tqdm=False)[0]
    assert (trace.info.kv_cache, trace.info.block_size, trace.info.num_kv_blocks) == ("paged", 4, 16)
    first, repeat = trace.events[0], trace.events[3]
    state = first.seqs[0]
    assert (state.prefill_tokens, state.kv_tokens, state.kv_reserved_tokens, len(state.block_table)) == (9, 9, 12, 3)
    assert first.num_free_blocks == 13 and first.cached_blocks == tuple(sorted(state.block_table[:2]))
    assert trace.events[2].num_free_blocks == 16  # finished: every block back, the prefix still cached
    state = repeat.seqs[0]
    assert again.num_cached_tokens == state.num_cached_tokens == 8
    assert state.prefill_tokens == 1 and state.block_table[:2] == first.seqs[0].block_table[:2]


def test_events_without_a_cache_show_the_recomputation(hf_checkpoint):
    llm = LLM(str(hf_checkpoint("llama_gqa_tied")[1]), skip_tokenizer_init=True, kv_cache="none")
    with record(llm) as trace:
        llm.generate({"prompt_token_ids": [1] * 6}, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert [(e.seqs[0].prefill_tokens, e.seqs[0].decode_tokens, e.seqs[0].kv_tokens) for e in trace.events] == [
        (6, 0, 0), (6, 1, 0), (6, 2, 0), (6, 3, 0)]


def test_recording_stops_when_the_block_ends(llm):
    with record(llm) as trace:
        pass
    llm.generate({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=2), use_tqdm=False)
    assert trace.events == [] and llm.llm_engine.step_listeners == []


def test_a_failing_listener_is_removed_with_a_warning_and_generation_goes_on(llm):
    def broken(event):
        raise KeyError("widget bug")

    llm.llm_engine.step_listeners.append(broken)
    with pytest.warns(RuntimeWarning, match="step listener .*broken.* raised KeyError: 'widget bug'; it was removed"):
        out = llm.generate({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3 and llm.llm_engine.step_listeners == []
