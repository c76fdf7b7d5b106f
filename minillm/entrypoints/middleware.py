"""What every HTTP request goes through before its route, as one plain ASGI layer: its arrival time,
the API key, and the body-size limit.

The limit holds for every body: one that announces its size (Content-Length) past the limit is
refused before a byte of it is read, and one sent in chunks without announcing it is counted as it
arrives and refused once it passes the limit. Reading never holds the event loop: each chunk is
awaited like any other I/O.
"""

from __future__ import annotations

import json
import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minillm.entrypoints.errors import error_body


class ServerGuard:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, api_key: str | None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # Before the body is read and parsed: a request's time to first token counts from here.
        scope.setdefault("state", {})["arrival_time"] = time.time()
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return await self._refuse_size(send, f"the request body is {int(length):,} bytes")
        if self.api_key is not None and scope["path"].startswith("/v1") and not secrets.compare_digest(
                headers.get("authorization", "").encode(), f"Bearer {self.api_key}".encode()):
            return await _reply(send, 401, "a valid API key is needed: send 'Authorization: Bearer KEY'")
        if scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        body = await self._read_body(receive)
        if body is None:
            return await self._refuse_size(send, "the request body is larger")
        return await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit (the rest is left unread)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: the route sees it as usual
                return b"".join(chunks)
            chunks.append(chunk := message.get("body", b""))
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse_size(self, send: Send, what: str) -> None:
        await _reply(send, 413, f"{what}; this server takes at most {self.max_body_bytes:,} "
                                "(minillm serve --max-body-bytes)")


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the client's own messages (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _reply(send: Send, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
