"""`minillm serve` as its own process: when the engine loop dies it logs the cause with its traceback
and exits non-zero, for a supervisor to restart it, as vLLM's server does."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

# The serve command, with the engine's step broken from the start, as a lost device would break it.
BROKEN_SERVE = """
import sys
from minillm.cli import main
from minillm.engine.llm_engine import LLMEngine

def broken(self):
    raise RuntimeError("device lost in the step")

LLMEngine.step = broken
main(["serve", "tiny", "--port", sys.argv[1], "--dtype", "float32", "--max-model-len", "128"])
"""


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


def test_a_dead_engine_is_logged_and_ends_the_server_with_a_non_zero_status():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-c", BROKEN_SERVE, str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while True:
            assert process.poll() is None and time.time() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        reply = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert reply.status_code == 503 and "device lost" in reply.json()["error"]["message"]
        status = process.wait(timeout=30)
    finally:
        process.kill()
        log = process.communicate()[0]
    assert status == 1, log
    assert "the engine loop died" in log, log
    # The traceback reaches into the broken step, where the cause was raised.
    assert "Traceback" in log and 'File "<string>", line 7, in broken' in log, log
    assert "RuntimeError: device lost in the step" in log
