"""`minillm serve`'s process: the engine, the app on uvicorn, and a watchdog that ends the process
when the engine dies.

A dead engine cannot come back (its state is lost mid-step), so the server should not stay up
answering 503 for ever: as vLLM's does, it logs the cause with its traceback and exits non-zero,
for a supervisor (systemd, Kubernetes, a shell loop) to start a fresh one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

import uvicorn

from minillm.async_llm import AsyncLLM
from minillm.entrypoints.api_server import build_app
from minillm.entrypoints.cli_args import engine_kwargs

logger = logging.getLogger(__name__)
WATCHDOG_INTERVAL_S = 0.5  # how soon a dead engine ends the server (vLLM looks every 5 s)


def run_server(args: argparse.Namespace, speculative_config: dict | None) -> int:
    """Serve until stopped; the process's exit status: 0 when stopped, 1 when the engine died."""
    template = Path(args.chat_template).read_text() if args.chat_template else None
    engine = AsyncLLM(args.model, speculative_config=speculative_config, **engine_kwargs(args))
    try:
        app = build_app(engine, args.served_model_name, args.api_key, template, args.max_body_bytes,
                        allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
                        allowed_headers=args.allowed_headers, allow_credentials=args.allow_credentials)
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info"))
        return asyncio.run(serve_http(server, engine))
    finally:
        engine.shutdown()


async def serve_http(server: uvicorn.Server, engine: AsyncLLM) -> int:
    """server.serve() beside the watchdog; 1 when the engine died, else 0."""
    watchdog = asyncio.create_task(_watch(server, engine))
    try:
        await server.serve()
    finally:
        watchdog.cancel()
    return 1 if engine.errored else 0


async def _watch(server: uvicorn.Server, engine: AsyncLLM) -> None:
    while not engine.errored:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
    error = engine.dead_error
    # The engine's error carries the step's exception as its cause: logging it prints both tracebacks.
    logger.error("the engine loop died; the server stops so that a supervisor can start a fresh one",
                 exc_info=(type(error), error, error.__traceback__))
    server.should_exit = True
