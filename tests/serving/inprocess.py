"""The server's app driven in-process with FastAPI's TestClient, for the tests that send it many
generated requests: one engine on `tiny` with a short context, so that whatever a request asks for
is served fast. Each test module opens one for all its tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fastapi.testclient import TestClient

from minillm.async_llm import AsyncLLM
from minillm.entrypoints.api_server import build_app

# Room for the 128 choices a request may ask for in one batch; 32 tokens of context bound each one's work.
ENGINE = {"dtype": "float32", "max_model_len": 32, "max_num_seqs": 128}


@contextlib.contextmanager
def app_client() -> Iterator[TestClient]:
    """A client of the app on a fresh engine; exceptions come back as the 500s a client would see."""
    engine = AsyncLLM("tiny", **ENGINE)
    try:
        with TestClient(build_app(engine), raise_server_exceptions=False) as client:
            yield client
    finally:
        engine.shutdown()


def assert_openai_error(reply, status: int = 400) -> dict:
    """reply is an error in OpenAI's shape with this status; its `error` object."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["code"] == status and error["type"].endswith("Error") and error["message"], error
    return error


def assert_still_serving(client: TestClient) -> None:
    """The engine took no harm: /health is fine and a plain request is served."""
    assert client.get("/health").status_code == 200
    ok = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2, ok.text
