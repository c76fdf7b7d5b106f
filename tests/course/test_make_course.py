"""README's first command, `make course`, serves JupyterLab: started here headless on a free port, as
whichever user runs the suite (root in CI and in containers, where JupyterLab refuses to start
unless allowed to), it must answer HTTP, with the whole course in its file browser (chapters,
exercises, solutions) and chapter 00 the page it opens. Uses this interpreter's environment as is,
never reinstalling it, and leaves the checkout's git settings alone (test_notebook_filter.py checks
the filter `make course` sets up)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "minillm-test-token"
START_SECONDS = 60  # about 5 s on an idle 2-core machine


def make_course(*course_args: str, dry_run: bool = False) -> list[str]:
    # VENV is this interpreter's environment; -o keeps make from reinstalling it and from setting up the
    # checkout's git filter.
    venv = Path(sys.prefix)
    return ["make", "--no-print-directory", *(["-n"] if dry_run else []), "-C", str(ROOT), f"VENV={venv}",
            "-o", f"{venv}/.installed", "-o", "notebook-filter", "course", f"COURSE_ARGS={' '.join(course_args)}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_is_allowed_to_run_as_root_and_only_as_root():
    command = subprocess.run(make_course(dry_run=True), capture_output=True, text=True, check=True).stdout
    assert "jupyter lab" in command and ("--allow-root" in command) == (os.getuid() == 0), command


@pytest.mark.timeout(2 * START_SECONDS)
def test_make_course_serves_jupyterlab(tmp_path):
    port = free_port()
    args = ("--no-browser", "--ServerApp.ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={TOKEN}")
    # The learner's own Jupyter settings and runtime files stay out of it, and it leaves none behind.
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "run"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        # A session of its own, so that make and the server it starts are stopped together.
        server = subprocess.Popen(make_course(*args), stdout=out, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)
    try:
        status = wait_for_status(port, server, log)
        assert "started" in status, status
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={TOKEN}", timeout=10) as page:
            assert page.status == 200 and b"JupyterLab" in page.read()
        course = ["notebooks/00_welcome.ipynb", "exercises/01_kv_cache.ipynb"]
        course += ["solutions/01_kv_cache.ipynb"] if (ROOT / "solutions").is_dir() else []
        for path in course:
            assert contents(port, path)["type"] == "notebook", f"{path} is not in JupyterLab's file browser"
        [opened] = (tmp_path / "run").glob("jpserver-file-to-run-*-open.html")
        assert "/lab/tree/notebooks/00_welcome.ipynb" in opened.read_text(), "chapter 00 must open first"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def contents(port: int, path: str) -> dict:
    """What JupyterLab's file browser knows of path (its contents API; HTTP 404 if it is outside the root)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/contents/{path}?content=0",
                                     headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def wait_for_status(port: int, server: subprocess.Popen, log: Path) -> dict:
    """The server's /api/status, once it answers."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/status", headers={"Authorization": f"token {TOKEN}"})
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"`make course` exited with {server.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.load(response)
        except OSError:  # not listening yet
            time.sleep(0.5)
    pytest.fail(f"`make course` did not answer on port {port} in {START_SECONDS}s:\n"
                f"{log.read_text(errors='replace')[-3000:]}")
