"""schemathesis drives every route of the server from its own OpenAPI schema (GET /openapi.json),
with requests valid and invalid by that schema, and checks each answer against it: no 5xx, a status
the route documents, the content type documented for that status, and a body that fits the schema
documented for it. A bounded run: a few cases per route and kind, on one in-process engine.

schemathesis's pytest plugin does not run under this pytest (9.2: it sets a node attribute pytest
dropped), so the cases are drawn from its per-route hypothesis strategies directly."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from inprocess import app_client, assert_still_serving
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation.modes import GenerationMode

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
ROUTES = ["GET /health", "GET /metrics", "GET /v1/models", "GET /v1/models/{model_id}", "GET /version",
          "POST /tokenize", "POST /detokenize", "POST /v1/completions", "POST /v1/chat/completions"]
CASES = settings(max_examples=15, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def client():
    with app_client() as c:
        yield c


@pytest.fixture(scope="module")
def api_schema(client):
    return schemathesis.openapi.from_asgi("/openapi.json", client.app)


def test_every_route_is_tested(api_schema):
    assert sorted(result.ok().label for result in api_schema.get_all_operations()) == sorted(ROUTES)


# Invalid requests for the routes that take a body (the others take nothing to get wrong).
@pytest.mark.parametrize("route, mode", [(route, GenerationMode.POSITIVE) for route in ROUTES]
                         + [(route, GenerationMode.NEGATIVE) for route in ROUTES if route.startswith("POST")],
                         ids=lambda value: getattr(value, "value", value))
def test_each_route_conforms_to_its_schema(api_schema, route, mode):
    operation = api_schema.find_operation_by_label(route)

    @CASES
    @given(case=operation.as_strategy(generation_mode=mode))
    def conforms(case) -> None:
        case.call_and_validate(checks=CHECKS)

    conforms()


def test_the_engine_still_serves_after_them(client):
    assert_still_serving(client)
