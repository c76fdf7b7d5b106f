"""A server in a background thread of this process, for notebooks, tests and `minillm bench serve`:

    with BackgroundServer("tiny", max_num_seqs=16) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="none")

It is the same app `minillm serve` runs, on real HTTP at 127.0.0.1 (port 0: any free one).
"""

from __future__ import annotations

import socket
import threading

import uvicorn

from minillm.async_llm import AsyncLLM
from minillm.entrypoints.api_server import build_app
from minillm.entrypoints.cli_args import MAX_BODY_BYTES


class BackgroundServer:
    def __init__(self, model: str, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 served_model_name: str | None = None, chat_template: str | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES, **engine_args) -> None:
        self.engine = AsyncLLM(model, **engine_args)
        try:
            app = build_app(self.engine, served_model_name, api_key, chat_template, max_body_bytes)
        except Exception:  # a chat template that does not parse: no server, and no engine thread left behind
            self.engine.shutdown()
            raise
        # The socket is bound here, so the port is known (and taken) before the thread starts.
        self._socket = socket.create_server((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="minillm-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """Where an OpenAI client points."""
        return self.url + "/v1"

    def start(self) -> BackgroundServer:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server stopped while starting; see its log above")
            self._thread.join(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()
        self._socket.close()
        self.engine.shutdown()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"BackgroundServer({self.engine.model_name!r}, url={self.url!r})"
