"""vLLM's `prompt_logprobs` request field: a completion's choices, or a chat response, carry the scores
of their prompt's tokens. Each must be what the offline API (LLM.generate with
SamplingParams.prompt_logprobs) gives for the same prompt, cut to the alternatives asked for; the
field is bounded like logprobs, refused with streaming, and refused by a server with speculative
decoding with a 400 that names it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from inprocess import ENGINE, app_client, assert_openai_error

from minillm import LLM, SamplingParams
from minillm.async_llm import AsyncLLM
from minillm.entrypoints.api_server import build_app

PROMPTS = ["def fibonacci(n):", "import numpy as np"]
MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def client():
    with app_client() as c:
        yield c


@pytest.fixture(scope="module")
def reference() -> LLM:
    return LLM("tiny", **ENGINE)


def offline(reference: LLM, token_ids: list[int], k: int) -> list:
    """The offline API's prompt_logprobs for this prompt, as the server writes them."""
    out = reference.generate([{"prompt_token_ids": token_ids}], SamplingParams(max_tokens=1, prompt_logprobs=k),
                             use_tqdm=False)[0]
    return [None if entry is None else {str(t): (lp.logprob, lp.rank, lp.decoded_token) for t, lp in entry.items()}
            for entry in out.prompt_logprobs]


def assert_same(served: list, expected: list) -> None:
    assert len(served) == len(expected) and served[0] is None and expected[0] is None
    for got, want in zip(served[1:], expected[1:]):
        assert list(got) == list(want), "the same tokens, the prompt's own first"
        for token, (logprob, rank, text) in want.items():
            assert got[token]["rank"] == rank and got[token]["decoded_token"] == text
            assert got[token]["logprob"] == pytest.approx(logprob, abs=1e-4)


def token_ids(client, body: dict) -> list[int]:
    reply = client.post("/tokenize", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


@pytest.mark.parametrize("k", [0, 3])
def test_each_choice_carries_its_prompts_scores_as_the_offline_api_gives_them(client, reference, k):
    reply = client.post("/v1/completions", json={"prompt": PROMPTS, "n": 2, "max_tokens": 2, "prompt_logprobs": k})
    assert reply.status_code == 200, reply.text
    choices = sorted(reply.json()["choices"], key=lambda c: c["index"])
    ids = [token_ids(client, {"prompt": prompt}) for prompt in PROMPTS]
    for choice in choices:  # choices 0 and 1 answer the first prompt, 2 and 3 the second
        assert_same(choice["prompt_logprobs"], offline(reference, ids[choice["index"] // 2], k))
        assert all(len(entry) <= k + 1 for entry in choice["prompt_logprobs"][1:])
    plain = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 1}).json()
    assert plain["choices"][0]["prompt_logprobs"] is None


@pytest.mark.parametrize("logprobs, k", [(1, 4), (4, 1)])
def test_echo_and_prompt_logprobs_each_get_the_alternatives_they_ask_for(client, reference, logprobs, k):
    """The engine scores the prompt once, with the most alternatives either asks for."""
    body = {"prompt": PROMPTS[0], "max_tokens": 1, "echo": True, "logprobs": logprobs, "prompt_logprobs": k}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    expected = offline(reference, token_ids(client, {"prompt": PROMPTS[0]}), k)
    assert_same(choice["prompt_logprobs"], expected)
    prompt_len = len(expected)
    assert all(len(top) <= logprobs + 1 for top in choice["logprobs"]["top_logprobs"][1:prompt_len])
    assert any(len(top) == logprobs + 1 for top in choice["logprobs"]["top_logprobs"][1:prompt_len])
    assert choice["logprobs"]["token_logprobs"][1:prompt_len] == pytest.approx(
        [next(iter(entry.values()))[0] for entry in expected[1:]], abs=1e-4)


def test_a_chat_response_carries_the_rendered_prompts_scores(client, reference):
    reply = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "n": 2,
                                                      "prompt_logprobs": 2})
    assert reply.status_code == 200, reply.text
    assert_same(reply.json()["prompt_logprobs"], offline(reference, token_ids(client, {"messages": MESSAGES}), 2))
    plain = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1}).json()
    assert plain["prompt_logprobs"] is None


@pytest.mark.parametrize("route, body", [("/v1/completions", {"prompt": "x"}),
                                         ("/v1/chat/completions", {"messages": MESSAGES})])
def test_bounded_like_logprobs_and_not_streamed(client, route, body):
    for value in (-1, 21, 2**63, True, "1", 1.0):
        error = assert_openai_error(client.post(route, json={**body, "prompt_logprobs": value}))
        assert error["param"] == "prompt_logprobs", (value, error)
    streamed = assert_openai_error(client.post(route, json={**body, "prompt_logprobs": 0, "stream": True}))
    assert "prompt_logprobs" in streamed["message"] and "stream" in streamed["message"]


def test_a_server_with_speculative_decoding_refuses_it_with_a_400():
    engine = AsyncLLM("tiny", **ENGINE, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                            "prompt_lookup_max": 2})
    try:
        with TestClient(build_app(engine), raise_server_exceptions=False) as client:
            for route, body in [("/v1/completions", {"prompt": "x", "prompt_logprobs": 1}),
                                ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 0}),
                                ("/v1/chat/completions", {"messages": MESSAGES, "prompt_logprobs": 0})]:
                error = assert_openai_error(client.post(route, json={**body, "max_tokens": 2}))
                assert "prompt_logprobs" in error["message"] and "speculative" in error["message"], error
            served = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert served.status_code == 200 and client.get("/health").status_code == 200
    finally:
        engine.shutdown()
