"""Property-based: whatever values a completion or chat request carries (numbers past every bound,
NaN and infinities, booleans and strings for numbers, long strings, nested junk), the server answers
a 400 in OpenAI's shape naming a field, or serves it (a whole response as its schema documents it);
never a 5xx, and the engine keeps serving.

One engine serves every example (inprocess.py); its short context keeps each served request cheap."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from inprocess import app_client, assert_still_serving

from minillm.entrypoints.responses import ChatCompletionResponse, CompletionResponse

INTS = st.sampled_from([0, 1, -1, 2, 20, 21, 128, 129, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1,
                        2**64 - 1, 2**64, 10**30]) | st.integers()
FLOATS = st.sampled_from([0.0, 0.5, 1.0, 2.0, -2.0, 1e-320, 3.5e38, 1e308]) | st.floats()  # NaN and inf included
JUNK = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=8)
WILD = (INTS | FLOATS | st.booleans() | st.none() | st.text(max_size=12) | st.just("x" * 4000)
        | st.lists(INTS, max_size=3) | JUNK)

# Values the server serves, field by field.
SAMPLING = {
    "n": [1, 2], "temperature": [0, 0.8], "top_p": [0.9], "top_k": [-1, 5], "min_p": [0.1], "seed": [7],
    "max_tokens": [1, 4], "min_tokens": [0, 2], "presence_penalty": [0.5], "frequency_penalty": [-0.5],
    "repetition_penalty": [1.2], "ignore_eos": [True], "stop": ["\n", ["a", "b"], []], "stop_token_ids": [[0], []],
    "stream": [True, False], "stream_options": [{"include_usage": True}], "user": ["someone"],
    "skip_special_tokens": [False], "include_stop_str_in_output": [True], "prompt_logprobs": [0, 3],
}
COMPLETION = {"prompt": ["def f(x):", ["a", "b"], [1, 2, 3], [[5], [6, 7]]]}, {
    **SAMPLING, "logprobs": [0, 2], "echo": [True]}
PARTS = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
CHAT = {"messages": [[{"role": "user", "content": "hi"}],
                     [{"role": "system", "content": "be brief"}, {"role": "user", "content": PARTS}]]}, {
    **SAMPLING, "max_completion_tokens": [2], "logprobs": [True], "top_logprobs": [0, 3]}


def requests(fields: tuple[dict, dict]) -> st.SearchStrategy[dict]:
    """A body of values the server serves, then up to two of its fields set to anything at all."""
    required, optional = fields

    def plausible(values: dict) -> dict:
        return {name: st.sampled_from(choices) for name, choices in values.items()}

    return st.builds(lambda body, wild: {**body, **wild},
                     st.fixed_dictionaries(plausible(required), optional=plausible(optional)),
                     st.dictionaries(st.sampled_from(sorted({**required, **optional})), WILD, max_size=2))


@pytest.fixture(scope="module")
def client():
    with app_client() as c:
        yield c


def check_reply(client, route: str, body: dict) -> None:
    # JSON as Python writes it, NaN and Infinity included (JSON has neither, but JSON readers take them).
    reply = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
    assert reply.status_code in (200, 400), (body, reply.status_code, reply.text[:300])
    if reply.status_code == 400:
        error = reply.json()["error"]
        assert error["code"] == 400 and error["type"] == "BadRequestError", error
        assert any(name in error["message"] for name in body), (body, error)
    elif reply.headers["content-type"].startswith("text/event-stream"):
        assert reply.text.endswith("data: [DONE]\n\n") and '{"error"' not in reply.text, reply.text[-300:]
    else:
        assert RESPONSES[route].model_validate_json(reply.text, strict=True).choices, reply.text
    assert client.get("/health").status_code == 200  # the engine loop survived it


RESPONSES = {"/v1/completions": CompletionResponse, "/v1/chat/completions": ChatCompletionResponse}
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(body=requests(COMPLETION))
def test_completions_answer_400_or_serve(client, body):
    check_reply(client, "/v1/completions", body)


@FUZZ
@given(body=requests(CHAT))
def test_chat_answers_400_or_serves(client, body):
    check_reply(client, "/v1/chat/completions", body)


def test_the_engine_still_serves_after_them(client):
    assert_still_serving(client)
