"""The rules of a request body at their edges, without a server: the last value each bound takes and
the first it refuses, the rules between fields (seed + n, echo with logprobs, prompt_logprobs once per
prompt), and the usage a response reports for several prompts and choices. test_bad_requests.py
sends values far past each bound through a server; these pin where the bound is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from minillm import LLM
from minillm.engine.parallel_sampling import child_params
from minillm.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from minillm.entrypoints.serving_engine import (
    MAX_COMPLETIONS,
    Prepared,
    check_fits_context,
    chunk_usage,
    prepare,
    usage,
)
from minillm.sampling_params import MAX_N, MAX_SEED


def completion(**fields) -> CompletionRequest:
    return CompletionRequest(prompt="x", **fields)


def test_seed_plus_n_may_reach_the_largest_seed_and_not_pass_it():
    """Choice j samples with seed + j: the last choice's seed is seed + n - 1, which must be a seed."""
    n = 3
    last_ok = completion(n=n, seed=MAX_SEED - n + 1).sampling_params(4, None)
    assert [child_params(last_ok, j).seed for j in range(n)] == [MAX_SEED - 2, MAX_SEED - 1, MAX_SEED]
    with pytest.raises(ValueError, match=f"seed must be in .* with n={n}"):
        completion(n=n, seed=MAX_SEED - n + 2).sampling_params(4, None)


def test_n_up_to_max_n_and_top_p_above_zero():
    assert completion(n=MAX_N).n == MAX_N
    with pytest.raises(ValidationError, match="n"):
        completion(n=MAX_N + 1)
    assert completion(top_p=1.0).top_p == 1.0
    with pytest.raises(ValidationError, match="top_p"):
        completion(top_p=0.0)  # (0, 1]: no token would be left to sample


def test_the_prompt_is_scored_once_for_its_choices_with_the_most_alternatives_asked():
    """prompt_logprobs, or echo with logprobs, scores the prompt on the first choice alone; echo asks
    for the larger of the two counts, and logprobs without echo scores nothing of the prompt."""
    params = completion(n=2, echo=True, logprobs=3, prompt_logprobs=1).sampling_params(4, 3)
    assert [child_params(params, j).prompt_logprobs for j in range(2)] == [3, None]
    assert completion(echo=True, logprobs=1, prompt_logprobs=4).num_prompt_logprobs() == 4
    assert completion(logprobs=3).num_prompt_logprobs() is None


def test_rules_between_fields_are_refused_by_name():
    with pytest.raises(ValueError, match="stream_options is only allowed with stream: true"):
        completion(stream_options={"include_usage": True}).refuse_unsupported()
    with pytest.raises(ValueError, match="top_logprobs needs logprobs: true"):
        ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], top_logprobs=2).refuse_unsupported()


def test_a_prompt_and_max_tokens_may_fill_the_context_exactly():
    check_fits_context(200, 56, 256)
    with pytest.raises(ValueError, match="max_tokens must be at most 56"):
        check_fits_context(200, 57, 256)


@pytest.fixture(scope="module")
def engine() -> SimpleNamespace:
    """What prepare reads of an AsyncLLM: its engine."""
    return SimpleNamespace(llm_engine=LLM("tiny", dtype="float32", max_model_len=64).llm_engine)


def test_a_request_may_ask_for_max_completions_and_not_one_more(engine):
    request = completion(n=MAX_N)
    prompts = [{"prompt_token_ids": [5, 6]}] * (MAX_COMPLETIONS // MAX_N)
    prepared = prepare(engine, prompts, request.sampling_params(4, None))
    assert prepared.count == MAX_COMPLETIONS
    with pytest.raises(ValueError, match="may ask for at most"):
        prepare(engine, prompts + prompts[:1], request.sampling_params(4, None))


def output(prompt_len: int, num_tokens: int) -> SimpleNamespace:
    return SimpleNamespace(prompt_token_ids=[1] * prompt_len, outputs=[SimpleNamespace(token_ids=[2] * num_tokens)])


def test_usage_counts_each_prompt_once_and_each_choice_and_chunks_count_their_own_prompt():
    """Two prompts of 3 and 7 tokens, two choices each (choice j of prompt p is p * n + j)."""
    outputs = {0: output(3, 4), 1: output(3, 5), 2: output(7, 1), 3: output(7, 2)}
    assert usage(outputs, 2) == {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22}
    request = completion(n=2, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    prompts = [{"prompt_token_ids": [1] * 3}, {"prompt_token_ids": [1] * 7}]
    prepared = Prepared(prompts, request.sampling_params(4, None))
    assert [chunk_usage(request, prepared, i, 1)["usage"]["prompt_tokens"] for i in range(4)] == [3, 3, 7, 7]
