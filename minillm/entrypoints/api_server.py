"""`minillm serve MODEL`: vLLM's OpenAI-compatible HTTP API on an `AsyncLLM`, with FastAPI.

Routes: POST /v1/completions and /v1/chat/completions (streamed as server-sent events with
`stream: true`), GET /v1/models and /v1/models/{id}, /health (503 once the engine is dead) and
/metrics (Prometheus); vLLM's POST /tokenize and /detokenize, and GET /version.
Errors are OpenAI-shaped: 400 for invalid input (the engine's own ValueError message), 401 without
the API key, 404 for another model's name, 413 for a body past the limit, 503 when the engine is dead.
A client that disconnects aborts its requests at once, whether it was streaming or waiting for the
whole response. Tokenizing and chat templating take time that grows with the prompt, so they run in
a thread: the event loop, which every client waits on, only moves bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minillm.async_llm import AsyncLLM, EngineDeadError
from minillm.entrypoints import serving_chat, serving_completion
from minillm.entrypoints.cli_args import MAX_BODY_BYTES
from minillm.entrypoints.errors import error, validation_error
from minillm.entrypoints.middleware import ServerGuard
from minillm.entrypoints.openapi import as_served, errors, returns, streamed
from minillm.entrypoints.prometheus import prometheus_text
from minillm.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingRequest,
    TokenizeRequest,
)
from minillm.entrypoints.responses import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
    VersionResponse,
)
from minillm.entrypoints.serving_engine import Indexed, Prepared, event_stream, fan_out, now, random_id, while_connected
from minillm.version import __version__

CLIENT_CLOSED = 499  # nginx's status for a request whose client left; nobody reads it
NO_TOKENIZER = "this server was started with skip_tokenizer_init: it has no tokenizer"


class PrometheusResponse(PlainTextResponse):
    media_type = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus's text exposition format


def build_app(engine: AsyncLLM, served_model_name: str | None = None, api_key: str | None = None,
              chat_template: str | None = None, max_body_bytes: int = MAX_BODY_BYTES, *,
              allowed_origins: Sequence[str] = ("*",), allowed_methods: Sequence[str] = ("*",),
              allowed_headers: Sequence[str] = ("*",), allow_credentials: bool = False) -> FastAPI:
    """chat_template: a Jinja template replacing the tokenizer's own; max_body_bytes: the largest
    request body taken, 413 past it; allowed_*, allow_credentials: the CORS policy for browsers, with
    vLLM's defaults (any origin, no credentials)."""
    model = served_model_name or engine.model_name
    if chat_template is not None:
        serving_chat.check_template(engine.get_tokenizer(), chat_template)
    app = FastAPI(title="minillm", version="0")
    app.add_middleware(ServerGuard, max_body_bytes=max_body_bytes, api_key=api_key)
    # Outermost, so that a browser's preflight is answered before the API key is asked for, and the
    # guard's own errors carry the CORS headers that let a page read them.
    app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=list(allowed_methods),
                       allow_headers=list(allowed_headers), allow_credentials=allow_credentials)

    as_served(app, [CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest])

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own answers (no such route, a wrong method, a body it cannot decode) in OpenAI's shape too.
        message = {400: "the body could not be read as JSON: it must be UTF-8, its integers at most 4,300 digits "
                        "long and its nesting within what Python's parser follows",
                   404: f"no route {request.url.path}",
                   405: f"{request.url.path} does not take {request.method}"}
        reply = error(e.status_code, message.get(e.status_code, str(e.detail)))
        reply.headers.update(e.headers or {})  # a 405's Allow: the methods the path takes
        return reply

    @app.exception_handler(EngineDeadError)
    async def dead(request: Request, e: EngineDeadError) -> JSONResponse:
        return error(503, str(e))

    @app.get("/health", response_class=Response, response_description="The engine is running (an empty body)",
             responses={503: {"description": "The engine has stopped (an empty body)"}})
    async def health() -> Response:
        return Response(status_code=503 if engine.errored else 200)

    @app.get("/metrics", response_class=PrometheusResponse)
    async def metrics() -> PrometheusResponse:
        return PrometheusResponse(prometheus_text(await engine.get_metrics()))

    def unknown_model(name: str) -> JSONResponse:
        return error(404, f"The model `{name}` does not exist; this server serves `{model}`")

    def card() -> dict:
        return {"id": model, "object": "model", "created": now(), "owned_by": "minillm",
                "root": engine.model_name, "max_model_len": engine.llm_engine.max_model_len}

    @app.get("/v1/models", responses={**returns(ModelList, "The model served"), **errors(401)})
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [card()]})

    @app.get("/v1/models/{model_id:path}", responses={**returns(ModelCard, "The model served"), **errors(401, 404)})
    async def model_card(model_id: str) -> Response:
        if model_id != model:
            return unknown_model(model_id)
        return JSONResponse(card())

    @app.get("/version", responses=returns(VersionResponse, "minillm's version"))
    async def version() -> Response:
        return JSONResponse({"version": __version__})

    @app.post("/tokenize", responses={**returns(TokenizeResponse, "The prompt's token ids"), **errors(400, 404, 413)})
    async def tokenize(request: TokenizeRequest) -> Response:
        if request.model is not None and request.model != model:
            return unknown_model(request.model)
        if (request.prompt is None) == (request.messages is None):
            return error(400, "send either prompt or messages")
        if (tokenizer := engine.get_tokenizer()) is None:
            return error(400, NO_TOKENIZER)

        def token_ids() -> list[int]:
            if request.messages is not None:
                chat = ChatCompletionRequest(messages=request.messages,
                                             add_generation_prompt=request.add_generation_prompt)
                return serving_chat.render(tokenizer, chat, chat_template)["prompt_token_ids"]
            return tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)["input_ids"]

        try:
            ids = await asyncio.to_thread(token_ids)
        except (ValueError, TypeError) as e:
            return error(400, str(e))
        return JSONResponse({"count": len(ids), "max_model_len": engine.llm_engine.max_model_len, "tokens": ids})

    @app.post("/detokenize", responses={**returns(DetokenizeResponse, "The tokens' text"), **errors(400, 413)})
    async def detokenize(request: DetokenizeRequest) -> Response:
        vocab = engine.llm_engine.model_config.vocab_size
        if bad := [t for t in request.tokens if not 0 <= t < vocab]:
            return error(400, f"tokens must be ids in [0, {vocab}); got {bad[:5]}")
        if (tokenizer := engine.get_tokenizer()) is None:
            return error(400, NO_TOKENIZER)
        return JSONResponse({"prompt": tokenizer.decode(request.tokens)})

    async def serve(request: SamplingRequest, raw: Request, prefix: str, prepare: Callable[[], Prepared],
                    full: Callable, chunks: Callable) -> Response:
        if engine.errored:
            raise engine.dead_error
        if request.model is not None and request.model != model:
            return unknown_model(request.model)
        try:
            request.refuse_unsupported()  # the request's own fields, before any choice is built
            prepared = await asyncio.to_thread(prepare)
            request_id = random_id(prefix)
            outputs = fan_out(engine, request_id, prepared, raw.state.arrival_time)
        except (ValueError, TypeError) as e:
            return error(400, str(e))
        outputs: AsyncIterator[Indexed] = while_connected(raw, outputs)
        if request.stream:
            return StreamingResponse(event_stream(chunks(request, request_id, prepared, model, outputs)),
                                     media_type="text/event-stream")
        body = await full(request, request_id, prepared, model, outputs)
        return Response(status_code=CLIENT_CLOSED) if body is None else JSONResponse(body)

    @app.post("/v1/completions", responses={
        **streamed(CompletionResponse, "The completion; server-sent events with stream: true"),
        **errors(400, 401, 404, 413, 503)})
    async def completions(request: CompletionRequest, raw: Request) -> Response:
        return await serve(request, raw, "cmpl", lambda: serving_completion.prepare_completion(engine, request),
                           serving_completion.full_response, serving_completion.stream_chunks)

    @app.post("/v1/chat/completions", responses={
        **streamed(ChatCompletionResponse, "The chat completion; server-sent events with stream: true"),
        **errors(400, 401, 404, 413, 503)})
    async def chat_completions(request: ChatCompletionRequest, raw: Request) -> Response:
        return await serve(request, raw, "chatcmpl",
                           lambda: serving_chat.prepare_chat(engine, request, chat_template),
                           serving_chat.full_response, serving_chat.stream_chunks)

    return app
