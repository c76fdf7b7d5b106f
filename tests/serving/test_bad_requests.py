"""Requests with extreme values get a 400 naming the field, and never stop the server serving."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from minillm.entrypoints.api_server import build_app
from minillm.entrypoints.background import BackgroundServer

ENGINE = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 4}
MESSAGES = [{"role": "user", "content": "x"}]


@pytest.fixture(scope="module")
def server():
    with BackgroundServer("tiny", **ENGINE) as s:
        yield s


def post(server: BackgroundServer, route: str, body: dict | str | bytes) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.base_url + route, content=content, headers={"content-type": "application/json"},
                      timeout=30)


def assert_still_serving(server: BackgroundServer) -> None:
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    ok = post(server, "/completions", {"prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("route, body, words", [
    ("/completions", {"prompt": "x", "max_tokens": 3, "temperature": 1, "top_k": 2**63}, "top_k"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "temperature": 1, "top_k": 2**63, "stream": True}, "top_k"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "seed": 2**64}, "seed"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "seed": 2**64, "stream": True}, "seed"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "seed": 2**64 - 1, "n": 2}, "seed"),
    ("/completions", {"prompt": "x", "max_tokens": 2**63}, "max_tokens"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "min_tokens": 2**63}, "min_tokens"),
    ("/completions", '{"prompt": "x", "max_tokens": 3, "temperature": NaN}', "temperature"),
    ("/completions", '{"prompt": "x", "max_tokens": 3, "top_p": Infinity}', "top_p"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "stop_token_ids": [2**63]}, "stop_token_ids"),
    ("/completions", {"prompt": list(range(1, 201)), "max_tokens": 100}, "max_tokens"),
    ("/completions", {"prompt": [False, True], "max_tokens": 3}, "prompt"),  # no coercion into numbers
    ("/completions", {"prompt": "x", "max_tokens": "3"}, "max_tokens"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "n": True}, "n: Input should be a valid integer"),
    ("/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 0}, "max_completion_tokens"),
    ("/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 1000}, "max_tokens"),
    ("/chat/completions", '{"messages": [{"role": "user", "content": "x"}], "temperature": -Infinity}',
     "temperature"),
    # a few kilobytes that would queue 16,000 requests, or scan 1,025 stops at every step of every choice
    ("/completions", {"prompt": ["x"] * 1000, "n": 16, "max_tokens": 1}, "prompt and n ask for 1000 x 16"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "stop": ["s"] * 1025}, "stop must have at most 1024"),
    ("/completions", {"prompt": "x", "max_tokens": 3, "stop_token_ids": list(range(1025))},
     "stop_token_ids must have at most 1024"),
    ("/completions", '{"prompt": "x", "max_tokens": 1' + "0" * 5000 + "}", "integers at most 4,300 digits"),
])
def test_extreme_values_get_a_400_naming_the_field(server, route, body, words):
    reply = post(server, route, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["code"] == 400 and error["type"] == "BadRequestError"
    assert_still_serving(server)


@pytest.mark.parametrize("route, body, words", [
    ("/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools is not supported"),
    ("/chat/completions", {"messages": MESSAGES, "tool_choice": "required"}, "tool_choice is not supported"),
    ("/chat/completions", {"messages": MESSAGES, "response_format": {"type": "json_object"}},
     "response_format is not supported"),
    ("/completions", {"prompt": "x", "logit_bias": {"5": 100}}, "logit_bias is not supported"),
    ("/completions", {"prompt": "x", "best_of": 3}, "best_of is not supported"),
    ("/completions", {"prompt": "x", "best_of": True}, "best_of is not supported"),  # not 1, whatever Python says
    ("/completions", {"prompt": "x", "suffix": "end"}, "suffix is not supported"),
    ("/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs needs logprobs"),
    ("/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options is only allowed"),
])
def test_what_minillm_does_not_implement_is_refused_by_name(server, route, body, words):
    reply = post(server, route, {**body, "max_tokens": 2})
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"]
    assert_still_serving(server)


def test_the_values_that_ask_for_nothing_are_served(server):
    """What clients send by default (null, empty, "none", plain text) and fields that change nothing."""
    neutral = {"tools": None, "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {},
               "best_of": 1, "suffix": None, "user": "someone", "parallel_tool_calls": False}
    reply = post(server, "/chat/completions", {"messages": MESSAGES, "max_tokens": 2, **neutral})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("template, words", [
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),  # what real templates raise
    ("{{ messages[0].missing.deeper }}", "has no attribute 'missing'"),
    ("{{ messages[0].content + 1 }}", "can only concatenate str"),
])
def test_a_chat_template_that_refuses_the_messages_gets_a_400(template, words):
    with BackgroundServer("tiny", chat_template=template, **ENGINE) as templated:
        for reply in (post(templated, "/chat/completions", {"messages": MESSAGES, "max_tokens": 2}),
                      httpx.post(templated.url + "/tokenize", json={"messages": MESSAGES}, timeout=30)):
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert error["message"].startswith("messages: the chat template refused them") and words in error[
                "message"], error
        ok = post(templated, "/completions", {"prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200


def test_a_chat_template_that_does_not_parse_stops_the_server_starting():
    with pytest.raises(ValueError, match="chat_template does not parse: Expected an expression"):
        BackgroundServer("tiny", chat_template="{% if %}", **ENGINE)


def test_a_prompt_and_max_tokens_past_the_context_name_both_lengths(server):
    error = post(server, "/completions", {"prompt": list(range(1, 201)), "max_tokens": 57}).json()["error"]
    assert "256" in error["message"] and "200" in error["message"] and "57" in error["message"]
    exactly = post(server, "/completions", {"prompt": list(range(1, 201)), "max_tokens": 56, "ignore_eos": True})
    assert exactly.status_code == 200 and exactly.json()["usage"]["completion_tokens"] == 56


def test_stop_token_ids_past_the_vocabulary_never_match_and_break_nothing(server):
    reply = post(server, "/completions", {"prompt": "x", "max_tokens": 3, "min_tokens": 3,
                                          "stop_token_ids": [10**6]})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
    assert_still_serving(server)


def test_routing_errors_and_a_body_that_is_not_utf_8_answer_in_openais_shape(server):
    replies = [(httpx.get(server.base_url + "/nothing", timeout=10), 404, "no route /v1/nothing"),
               (httpx.get(server.base_url + "/completions", timeout=10), 405, "does not take GET"),
               (post(server, "/completions", '{"prompt": "\xff"}'.encode("latin-1")), 400, "must be UTF-8")]
    for reply, status, words in replies:
        assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        assert error["code"] == status and words in error["message"] and error["type"].endswith("Error"), error
    assert_still_serving(server)


def test_a_body_past_the_limit_gets_a_413_before_it_is_read():
    """Checked by its Content-Length, so a huge body costs the event loop nothing, or, sent in chunks
    without one, as it arrives; the limit is the server's --max-body-bytes (here 4 KiB), and a body
    under it is served as usual, chunked or not."""
    with BackgroundServer("tiny", max_body_bytes=4096, **ENGINE) as small:
        reply = post(small, "/completions", {"prompt": "x" * 5000, "max_tokens": 2})
        assert reply.status_code == 413, reply.text
        error = reply.json()["error"]
        assert "at most 4,096" in error["message"] and error["code"] == 413
        assert_still_serving(small)

        def chunked(size: int) -> httpx.Response:
            body = json.dumps({"prompt": "x", "max_tokens": 2, "user": "u" * size}).encode()
            pieces = (body[i:i + 1000] for i in range(0, len(body), 1000))  # no Content-Length: chunked
            return httpx.post(small.base_url + "/completions", content=pieces, timeout=30,
                              headers={"content-type": "application/json"})

        reply = chunked(5000)
        assert reply.status_code == 413 and "at most 4,096" in reply.json()["error"]["message"], reply.text
        assert chunked(3000).status_code == 200
        assert_still_serving(small)


def test_health_answers_within_a_second_while_a_16_mb_request_is_tokenized(server, monkeypatch):
    """Tokenizing runs in a thread, so the event loop answers others meanwhile. Tokenizing 16 MB
    for real takes a minute of CPU; the tokenizer is slowed instead, by more than the bound."""
    tokenizing = threading.Event()
    process_prompt = server.engine.llm_engine.input_processor.process_prompt

    def slow(prompt):
        if isinstance(prompt, dict) and "prompt_token_ids" not in prompt:
            tokenizing.set()
            time.sleep(2)
            prompt = {"prompt": prompt["prompt"][:10]}
        return process_prompt(prompt)

    monkeypatch.setattr(server.engine.llm_engine.input_processor, "process_prompt", slow)
    replies = []
    big = threading.Thread(target=lambda: replies.append(post(server, "/completions", {
        "prompt": "x" * 16_000_000, "max_tokens": 2})))
    big.start()
    assert tokenizing.wait(timeout=30)
    start = time.time()
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    assert time.time() - start < 1
    big.join()
    assert replies[0].status_code == 200, replies[0].text


@pytest.mark.parametrize("route, body, param", [
    ("/completions", '{"prompt": "ab\\ud800", "max_tokens": 2}', "prompt"),
    ("/completions", '{"prompt": ["x", "\\udfff"], "max_tokens": 2}', "prompt[1]"),
    ("/completions", '{"prompt": "x", "stop": ["\\ud800"], "max_tokens": 2}', "stop[0]"),
    ("/completions", '{"prompt": "x", "model": "\\ud800", "max_tokens": 2}', "model"),  # once a 500: quoted in a 404
    ("/completions", '{"prompt": "x", "user": {"\\ud800": 1}, "max_tokens": 2}', "user (a key)"),
    ("/chat/completions", '{"messages": [{"role": "user", "content": "\\udc00"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "x\\ud800"}]}]}',
     "messages[0].content[0].text"),
    # Encoded as UTF-8 would encode it, were it allowed: Python's JSON reader lets it through too.
    ("/chat/completions", b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', "messages[0].content"),
])
def test_a_lone_surrogate_gets_a_400_naming_its_field(server, route, body, param):
    """JSON's "\\ud800" parses into a Python str that no UTF-8 text holds: the tokenizer would fail on
    it with a message about its own internals, and a reply quoting it could not be encoded."""
    reply = post(server, route, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["message"].startswith(param) and "lone surrogate" in error["message"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert_still_serving(server)


@pytest.mark.parametrize("route, body", [
    ("/completions", b'{"prompt": "\xc3\x28", "max_tokens": 2}'),  # a broken two-byte sequence
    ("/tokenize", b'{"prompt": "\xff"}'),
])
def test_a_body_that_is_not_utf_8_gets_a_400_that_says_so(server, route, body):
    url = server.url + route if route == "/tokenize" else server.base_url + route
    reply = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "UTF-8" in error["message"] and error["code"] == 400 and error["type"] == "BadRequestError"
    assert_still_serving(server)


def test_a_body_of_exactly_the_limit_is_served_and_one_byte_more_is_refused(server):
    """--max-body-bytes is the largest body taken, whether its size is announced (Content-Length)
    or counted as it arrives in chunks; the 413 is JSON in OpenAI's shape."""
    body = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
    client = TestClient(build_app(server.engine, max_body_bytes=len(body)))
    headers = {"content-type": "application/json"}
    for content in (body, iter([body[:10], body[10:]])):
        assert client.post("/v1/completions", content=content, headers=headers).status_code == 200
    padded = body[:-1] + b" }"
    for content in (padded, iter([padded[:10], padded[10:]])):
        reply = client.post("/v1/completions", content=content, headers=headers)
        assert reply.status_code == 413 and reply.headers["content-type"] == "application/json", reply.text
        assert f"at most {len(body):,}" in reply.json()["error"]["message"]


@pytest.mark.parametrize("route, body, param, message", [
    ("/chat/completions", {"messages": [{"content": "x"}]}, "messages[0].role", "Field required"),
    ("/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text", "Field required"),
    # Of the union's members, the list of token ids gets furthest: its complaint about the value wins
    # over the others' about the type.
    ("/completions", {"prompt": [-1]}, "prompt[0]", "Input should be greater than or equal to 0"),
    ("/completions", {"prompt": [[1, -1]]}, "prompt[0][1]", "Input should be greater than or equal to 0"),
    ("/completions", {"prompt": "x", "stop": ["a", 5]}, "stop[1]", "Input should be a valid string"),
])
def test_an_invalid_field_inside_a_list_is_named_as_the_request_writes_it(server, route, body, param, message):
    """param and the message's start name the field as the body spells it (messages[0].role), and
    for a union the most specific complaint is told."""
    error = post(server, route, {**body, "max_tokens": 2}).json()["error"]
    assert error == {"message": f"{param}: {message}", "type": "BadRequestError", "param": param, "code": 400}
