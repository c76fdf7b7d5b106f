"""SamplingParams.n: n completions of one prompt (engine/parallel_sampling.py). Completion j is what a
request of its own with seed + j gives, whatever else the engine does (async scheduling, speculation,
preemption, a cache without prefix caching); the prompt is computed once; streamed and whole outputs
come back under the request's id; aborting the request stops every completion and frees its blocks."""

from __future__ import annotations

import pytest

from minillm import LLM, SamplingParams
from minillm.sampling_params import MAX_N, RequestOutputKind

PROMPT = {"prompt_token_ids": [(7 * i + 3) % 900 + 5 for i in range(53)]}  # 3 full blocks of 16, and 5 tokens
SHORT = {"prompt_token_ids": [11, 12, 13]}  # less than a block: nothing to share


def alone(llm: LLM, prompt: dict, params: SamplingParams, n: int) -> list[list[int]]:
    """Each completion's tokens, from a request of its own with the seed completion j has."""
    return [llm.generate(prompt, SamplingParams(**{**fields_of(params), "n": 1, "seed": None if params.seed is None
                                                     else params.seed + j}), use_tqdm=False)[0].outputs[0].token_ids
            for j in range(n)]


def fields_of(params: SamplingParams) -> dict:
    return {k: getattr(params, k) for k in ("temperature", "top_k", "seed", "max_tokens", "ignore_eos")}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", dtype="float32", max_model_len=160)


def test_completion_j_is_the_request_with_seed_plus_j(llm):
    params = SamplingParams(n=4, temperature=0.9, top_k=50, seed=123, max_tokens=24, ignore_eos=True)
    outputs = llm.generate([PROMPT, SHORT], params, use_tqdm=False)
    for prompt, out in zip([PROMPT, SHORT], outputs):
        assert [c.index for c in out.outputs] == [0, 1, 2, 3]
        assert out.prompt_token_ids == prompt["prompt_token_ids"] and out.finished
        tokens = [c.token_ids for c in out.outputs]
        assert tokens == alone(llm, prompt, params, 4)
        assert len({tuple(t) for t in tokens}) > 1, "four seeds gave one completion: the check cannot tell them apart"
    assert not llm.llm_engine.has_unfinished_requests()


def test_greedy_completions_are_all_the_greedy_one(llm):
    params = SamplingParams(n=3, temperature=0, max_tokens=20, ignore_eos=True)
    expected = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [expected] * 3


def prefix_cache_hits(llm: LLM) -> int:
    return next(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")


def test_the_prompt_is_computed_once_and_its_blocks_shared():
    """The first completion computes the prompt; the other three, in the same step, find its 3 full
    blocks in the cache (48 tokens each) and compute only the 5 after them; with prefix caching off,
    all four compute it."""
    events = []
    llm = LLM("tiny", dtype="float32", max_model_len=160, block_size=16)
    llm.llm_engine.step_listeners.append(events.append)
    llm.generate(PROMPT, SamplingParams(n=4, temperature=0, max_tokens=4), use_tqdm=False)
    assert prefix_cache_hits(llm) == 3 * 48
    assert [(s.request_id, s.prefill_tokens) for s in events[0].seqs] == [("0_0", 53), ("1_0", 5), ("2_0", 5),
                                                                          ("3_0", 5)]
    prefill = sum(s.prefill_tokens for e in events for s in e.seqs)
    assert prefill == 53 + 3 * 5
    pool = llm.llm_engine.block_manager
    assert pool.num_free_blocks == pool.num_blocks

    uncached = LLM("tiny", dtype="float32", max_model_len=160, block_size=16, enable_prefix_caching=False)
    events.clear()
    uncached.llm_engine.step_listeners.append(events.append)
    uncached.generate(PROMPT, SamplingParams(n=4, temperature=0, max_tokens=4), use_tqdm=False)
    assert sum(s.prefill_tokens for e in events for s in e.seqs) == 4 * 53
    assert [s.request_id for s in events[0].seqs] == ["0_0", "1_0", "2_0", "3_0"]


@pytest.mark.parametrize("engine_args", [
    {"async_scheduling": True},
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}},
    {"num_kv_blocks": 8, "block_size": 16, "max_num_batched_tokens": 32},  # the completions preempt each other
    {"kv_cache": "contiguous"},
], ids=["async", "ngram", "preemption", "contiguous"])
def test_completions_hold_across_engine_features(engine_args):
    """Each completion is the request of its own on the same engine (speculative sampling draws other
    tokens than plain sampling from the same seed, equally likely ones)."""
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=40, ignore_eos=True)
    llm = LLM("tiny", dtype="float32", max_model_len=96, **engine_args)
    events = []
    if "num_kv_blocks" in engine_args:  # (a listener turns async scheduling off, so only here)
        llm.llm_engine.step_listeners.append(events.append)
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    if events:
        assert any(e.preempted for e in events), "no completion was preempted"
    assert [c.token_ids for c in out.outputs] == alone(llm, PROMPT, params, 3)
    assert not llm.llm_engine.has_unfinished_requests()


def test_streamed_outputs_carry_one_completion_each_under_the_request_id(llm):
    engine = llm.llm_engine
    params = SamplingParams(n=3, temperature=0.8, seed=9, max_tokens=6, ignore_eos=True,
                            output_kind=RequestOutputKind.CUMULATIVE)
    engine.add_request("s", PROMPT, params)
    seen: dict[int, list[int]] = {}
    finished = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "s" and len(out.outputs) == 1
            completion = out.outputs[0]
            assert completion.token_ids[:len(seen.get(completion.index, []))] == seen.get(completion.index, [])
            seen[completion.index] = completion.token_ids
            finished.append(out.finished)
    assert finished[-1] and not any(finished[:-1])  # finished once, with the last completion
    assert [seen[j] for j in range(3)] == alone(llm, PROMPT, params, 3)


def test_the_prompt_scores_come_with_the_whole_output(llm):
    scored = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2)
    expected = llm.generate(PROMPT, scored, use_tqdm=False)[0].prompt_logprobs
    out = llm.generate(PROMPT, SamplingParams(n=2, temperature=0, max_tokens=3, prompt_logprobs=2),
                       use_tqdm=False)[0]
    assert len(out.prompt_logprobs) == 53 and out.prompt_logprobs[0] is None
    assert [{t: lp.logprob for t, lp in e.items()} for e in out.prompt_logprobs[1:]] == \
        [{t: lp.logprob for t, lp in e.items()} for e in expected[1:]]


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_aborting_the_request_stops_every_completion_and_frees_its_blocks(llm, steps):
    """Before any step, all four completions wait; after 1, they have computed the prompt; after 3, they decode."""
    engine = llm.llm_engine
    engine.add_request("a", PROMPT, SamplingParams(n=4, max_tokens=50, ignore_eos=True,
                                                   output_kind=RequestOutputKind.FINAL_ONLY))
    for _ in range(steps):
        assert engine.step() == []
    engine.abort_request("a")
    assert not engine.has_unfinished_requests() and not engine.parallel_sampling.knows("a")
    pool = engine.block_manager
    assert pool.num_free_blocks == pool.num_blocks
    engine.add_request("a", PROMPT, SamplingParams(n=2, max_tokens=2))  # the id is free again
    engine.abort_request("1_a")  # a completion's id stops the whole request
    assert not engine.has_unfinished_requests()


def test_ids_in_use_are_refused_whole(llm):
    engine = llm.llm_engine
    engine.add_request("0_b", SHORT, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="request_id 'b' with n=2 names its completions '0_b' to '1_b'"):
        engine.add_request("b", SHORT, SamplingParams(n=2, max_tokens=2))
    engine.add_request("c", SHORT, SamplingParams(n=2, max_tokens=2))
    with pytest.raises(ValueError, match="request_id 'c' is already in the engine"):
        engine.add_request("c", SHORT, SamplingParams(max_tokens=2))
    engine.abort_request("0_b")
    engine.abort_request("c")
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize(("n", "error"), [(0, ValueError), (MAX_N + 1, ValueError), (2.0, TypeError),
                                          (True, TypeError)])
def test_n_is_a_bounded_integer(n, error):
    with pytest.raises(error, match="^n must be"):
        SamplingParams(n=n)


def test_streaming_text_takes_one_completion(llm):
    with pytest.raises(ValueError, match="n must be 1 to stream"):
        next(llm.stream("Hello", SamplingParams(n=2)))
