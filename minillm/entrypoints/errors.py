"""OpenAI's error shape, which every error the server sends takes (its clients read the message
from it), and FastAPI's validation errors told in it: a 400 whose message and `param` name the field."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowedError",
               413: "RequestTooLargeError", 500: "InternalServerError", 503: "ServiceUnavailableError"}
# The names pydantic gives the members of a union in an error's location (str, list[int],
# function-after[...]): the type tried, not a field of the request.
_TYPE_NAMES = {"str", "int", "float", "bool", "none", "list", "dict"}


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None  # the field at fault, where one is known
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """An ErrorResponse. The message may quote the request; a lone surrogate quoted in it is escaped,
    as no UTF-8 reply can hold one."""
    message, param = (None if s is None else s.encode("utf-8", "backslashreplace").decode() for s in (message, param))
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": param, "code": status}}


def error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


def field_path(loc: tuple) -> str:
    """A pydantic error's location as the request writes it (messages[0].content), union members left out."""
    path = ""
    for part in loc[1:] if loc[:1] == ("body",) else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in _TYPE_NAMES and "[" not in part and "-" not in part:
            path += f".{part}" if path else part
    return path


def validation_error(e: RequestValidationError) -> JSONResponse:
    """The 400 for a body FastAPI could not parse or validate."""
    errors = e.errors()
    if errors[0]["type"] == "json_invalid":
        first = errors[0]
        return error(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    # Each member of a union reports its own error. The deepest is the most specific, and among
    # those, one about the value (out of range, too short) beats a member of the wrong type.
    worst = max(errors, key=lambda err: (len(err["loc"]), not err["type"].endswith("_type")))
    path, message = field_path(worst["loc"]), worst["msg"].removeprefix("Value error, ")
    # A check of the whole body (a lone surrogate) names its field itself, in the message and ctx.
    return error(400, f"{path}: {message}" if path else message, (worst.get("ctx") or {}).get("param") or path or None)
