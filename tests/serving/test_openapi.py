"""GET /openapi.json says what the server does: errors are 400s in OpenAI's shape (never FastAPI's
422), /health and /metrics are documented with what they send, each 200 that is JSON is documented
by a closed schema that what the server sends fits, and each bound a request model states is the
server's own: a value at it is served, one just past it is refused naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import jsonschema
import pytest
from inprocess import app_client, assert_openai_error, assert_still_serving
from jsonschema.exceptions import ValidationError

from minillm.entrypoints.errors import ErrorResponse

ROUTES = {"/v1/completions": ("CompletionRequest", {"prompt": "x", "max_tokens": 1}),
          "/v1/chat/completions": ("ChatCompletionRequest",
                                   {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})}
# What a field's value needs beside it to be served: rules between fields, which a schema cannot state.
BESIDE = {"top_logprobs": {"logprobs": True}, "min_tokens": {"max_tokens": None}, "max_tokens": {"echo": True}}
# Values within the schema's bounds that the model's own limits refuse (its context, its vocabulary):
# a 400 all the same, whose message says which limit.
MODEL_LIMITS = {"max_tokens": "max_model_len", "max_completion_tokens": "max_model_len", "prompt": "prompt_token_ids"}
MESSAGES = [{"role": "user", "content": "hi"}]
# Requests whose answers between them carry every field of every documented 200 body, nullable ones
# both null and not.
SERVED = [
    ("get", "/v1/models", None), ("get", "/v1/models/tiny", None), ("get", "/version", None),
    ("post", "/tokenize", {"prompt": "x"}), ("post", "/tokenize", {"messages": MESSAGES}),
    ("post", "/detokenize", {"tokens": [1, 2]}),
    ("post", "/v1/completions", {"prompt": "x", "max_tokens": 2}),
    ("post", "/v1/completions", {"prompt": ["x", "y z"], "n": 2, "max_tokens": 3, "logprobs": 2, "prompt_logprobs": 1,
                                 "stop": "z", "stop_token_ids": [0]}),
    ("post", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 0, "echo": True, "logprobs": 1}),
    ("post", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}),
    ("post", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "n": 2, "logprobs": True,
                                      "top_logprobs": 2, "prompt_logprobs": 0}),
]


@pytest.fixture(scope="module")
def client():
    with app_client() as c:
        yield c


@pytest.fixture(scope="module")
def schema(client) -> dict:
    return client.get("/openapi.json").json()


def test_errors_are_documented_as_400s_in_openais_shape_never_422(client, schema):
    operations = [(path, op) for path, ops in schema["paths"].items() for op in ops.values()]
    assert all("422" not in op["responses"] for _, op in operations)
    assert not {"HTTPValidationError", "ValidationError"} & set(schema["components"]["schemas"])
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, op in operations:
        if "requestBody" in op:
            assert op["responses"]["400"]["content"]["application/json"]["schema"] == error_ref, path
    # What a 400 really carries validates against what is documented.
    documented = {**error_ref, "components": schema["components"]}
    reply = client.post("/v1/completions", json={"prompt": "x", "n": "2"})
    jsonschema.validate(assert_openai_error(reply) and reply.json(), documented)
    assert reply.json()["error"]["param"] == "n"
    assert ErrorResponse.model_validate(reply.json())


def test_health_and_metrics_are_documented_with_what_they_send(client, schema):
    health = client.get("/health")
    assert health.status_code == 200 and health.content == b"" and "content-type" not in health.headers
    assert "content" not in schema["paths"]["/health"]["get"]["responses"]["200"]
    metrics = client.get("/metrics")
    assert list(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == [metrics.headers["content-type"]]
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    streamed = schema["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert set(streamed) == {"application/json", "text/event-stream"}


def documented_200(schema: dict, method: str, path: str) -> dict:
    """The schema of the route's 200 JSON body, resolvable on its own."""
    body = schema["paths"][path.replace("/tiny", "/{model_id}")][method]["responses"]["200"]["content"]
    return {**body["application/json"]["schema"], "components": schema["components"]}


def test_each_json_200_is_documented_by_a_closed_schema_that_the_answer_fits(client, schema):
    for method, path, body in SERVED:
        reply = client.request(method, path, json=body)
        assert reply.status_code == 200, (path, body, reply.text)
        documented = documented_200(schema, method, path)
        jsonschema.validate(reply.json(), documented)
        # Closed: a field the schema does not name is refused, at the top and in a nested object.
        with pytest.raises(ValidationError, match="unexpected"):
            jsonschema.validate({**reply.json(), "extra": 1}, documented)
        if "choices" in reply.json():
            choice = reply.json()["choices"][0]
            with pytest.raises(ValidationError, match="unexpected"):
                jsonschema.validate({**reply.json(), "choices": [{**choice, "extra": 1}]}, documented)


def bounded_leaves(field: dict, wrap: Callable = lambda v: v) -> Iterator[tuple[Callable, dict]]:
    """Each numeric schema within a field's schema that has bounds, with how to place a value there
    (wrapped in a list for an array's items)."""
    if field.get("type") in ("integer", "number") and {"minimum", "maximum", "exclusiveMinimum"} & set(field):
        yield wrap, field
    for member in field.get("anyOf", []):
        yield from bounded_leaves(member, wrap)
    if "items" in field:
        yield from bounded_leaves(field["items"], lambda v, wrap=wrap: wrap([v]))


def at_and_past(leaf: dict) -> Iterator[tuple[str, object, object]]:
    """(which bound, a value at it, a value just past it) for each bound of a numeric schema."""
    integer = leaf["type"] == "integer"
    if "minimum" in leaf:
        low = int(leaf["minimum"]) if integer else leaf["minimum"]
        yield "minimum", low, low - 1 if integer else math.nextafter(low, -math.inf)
    if "exclusiveMinimum" in leaf:
        yield "minimum", math.nextafter(leaf["exclusiveMinimum"], math.inf), leaf["exclusiveMinimum"]
    if "maximum" in leaf:
        high = int(leaf["maximum"]) if integer else leaf["maximum"]
        yield "maximum", high, high + 1 if integer else math.nextafter(high, math.inf)


@pytest.mark.parametrize("route", ROUTES)
def test_each_bound_of_the_schema_is_the_servers(client, schema, route):
    model, base = ROUTES[route]
    properties = schema["components"]["schemas"][model]["properties"]
    checked = []
    for name, field in properties.items():
        for wrap, leaf in bounded_leaves(field):
            for bound, at, past in at_and_past(leaf):
                body = {**base, **BESIDE.get(name, {})}
                reply = client.post(route, json={**body, name: wrap(at)})
                if bound == "maximum" and name in MODEL_LIMITS:
                    assert MODEL_LIMITS[name] in assert_openai_error(reply)["message"]
                else:
                    assert reply.status_code == 200, (name, at, reply.text)
                error = assert_openai_error(client.post(route, json={**body, name: wrap(past)}))
                assert error["param"].startswith(name) and name in error["message"], (name, past, error)
                wrong_type = True if leaf["type"] == "integer" else "1"  # no coercion into numbers
                assert assert_openai_error(client.post(route, json={**body, name: wrap(wrong_type)}))["param"] \
                    .startswith(name)
                checked.append(name)
    # Every sampling field is bounded in the schema, not only in the engine.
    assert {"n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens", "presence_penalty",
            "frequency_penalty", "repetition_penalty", "stop_token_ids", "prompt_logprobs"} <= set(checked)
    assert_still_serving(client)
