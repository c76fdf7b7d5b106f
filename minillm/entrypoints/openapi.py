"""The OpenAPI schema (GET /openapi.json) as the server behaves. FastAPI derives it from the routes
and the request models; what it cannot see is added here (each route's errors in OpenAI's shape,
the body of each 200 (responses.py: the routes send plain dicts), the event stream a completion
becomes with stream: true, /health's empty answers), and what it gets wrong is put right: the 422
it documents for every body, where this server answers 400, and the bounds it rounds."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from minillm.entrypoints.errors import ErrorResponse

_WHEN = {400: "The request is invalid: the message (and `param`, where it can) names the field",
         401: "The server was started with an API key, and the request did not send it",
         404: "The request names another model than the one served",
         413: "The body is larger than the server takes (minillm serve --max-body-bytes)",
         503: "The engine has stopped; the server exits so that a supervisor restarts it"}
# Each event of a stream (OpenAPI 3.2's itemSchema, as FastAPI writes it for its own streams): a
# chunk of the response as JSON, or an error in OpenAI's shape, and `[DONE]` last.
EVENT_STREAM = {"text/event-stream": {"itemSchema": {"type": "object", "required": ["data"],
                                                     "properties": {"data": {"type": "string"}}}}}


def errors(*statuses: int) -> dict[int | str, dict]:
    """The `responses` of a route that can answer with these errors."""
    return {status: {"model": ErrorResponse, "description": _WHEN[status]} for status in statuses}


def returns(model: type[BaseModel], description: str) -> dict[int | str, dict]:
    """A 200 whose JSON body is model (responses.py: closed, as the server sends it)."""
    return {200: {"model": model, "description": description}}


def streamed(model: type[BaseModel], description: str) -> dict[int | str, dict]:
    """A 200 that is model as JSON, or server-sent events with stream: true."""
    return {200: {"model": model, "description": description, "content": EVENT_STREAM}}


def as_served(app: FastAPI, request_models: Sequence[type[BaseModel]]) -> None:
    """Make app's schema what the server does: without FastAPI's 422 and its validation-error models
    (errors.validation_error answers such bodies with a 400, which each route documents), and with
    request_models' schemas exactly as pydantic states them (FastAPI's own pass stores every bound as
    a float, which moves the largest seed, 2**64 - 1, up to 2**64)."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            for operations in schema["paths"].values():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
            components = schema["components"]["schemas"]
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            _, exact = models_json_schema([(model, "validation") for model in request_models],
                                          ref_template="#/components/schemas/{model}")
            components.update(exact["$defs"])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
