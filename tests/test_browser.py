"""CacheGrowth in a real browser: JupyterLab serves a copy of notebooks/01_kv_cache.ipynb, headless
Chromium runs all its cells, and the widget must show its controls and its plotly chart, answer its
unit toggle and its step slider, and leave no error in the notebook, the page or its console.

Needs Debian's Chromium (/usr/bin/chromium) and playwright; without them the test skips, unless
MINILLM_REQUIRE_BROWSER=1 (.ci/run sets it) makes that a failure. Screenshots are written to
artifacts/browser/, which CI keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from notebook_runs import NOTEBOOK_ENV, ROOT

from minillm.loader import resolve_model_path

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # a learner's laptop without the dev extras: the test skips (see require_browser)
    expect = sync_playwright = None

if TYPE_CHECKING:
    from playwright.sync_api import ConsoleMessage, Error, Locator, Page, Route

CHROMIUM = Path("/usr/bin/chromium")
# Headless as root on a machine without GPU or network: no sandbox (it needs an unprivileged
# user), no GPU process, no /dev/shm (small in containers), and no background fetches that can
# only fail.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update"]
NOTEBOOK = "notebooks/01_kv_cache.ipynb"
WIDGET_CELL = "view = CacheGrowth(cached)"  # source line that identifies the cell displaying the widget
ARTIFACTS = ROOT / "artifacts" / "browser"
KERNEL_IDLE = "Python 3 (ipykernel) | Idle"  # JupyterLab's status bar once the kernel can take work

# Every request that leaves 127.0.0.1 is aborted, so that a hidden CDN dependency fails here instead
# of hanging or passing on a networked laptop. These are expected, with why they are harmless; the
# console error each abort logs (its location is the URL) is expected with it.
EXPECTED_EXTERNAL = {
    "https://colab.research.google.com/assets/colab-badge.svg":
        "the 'Open in Colab' badge image in each notebook's title cell: a link for learners, not a dependency",
}

# True once the first code cell has run, no cell is queued or running ("[*]"), and the kernel is
# idle. After an error, JupyterLab drops the queued cells back to "[ ]", so this ends then too.
RUN_FINISHED = """idle => {
    const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
        .map(p => p.textContent.trim());
    const status = document.querySelector('.jp-StatusBar-Widget');
    return prompts.length > 0 && /^\\[\\d+\\]:$/.test(prompts[0]) && !prompts.includes('[*]:')
        && status !== null && status.textContent.includes(idle);
}"""


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(420)
def test_cache_growth_renders_and_responds_in_jupyterlab(tmp_path: Path) -> None:
    require_browser()
    model = NOTEBOOK_ENV["MINILLM_MODEL"]
    if not (resolve_model_path(model) / "model.safetensors").is_file():
        pytest.fail(f"the notebook's model {model!r} is missing (minillm/assets/{model}/model.safetensors)")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # screenshots of an earlier run must not pass for this one's
    ARTIFACTS.mkdir(parents=True)

    with jupyter_lab(tmp_path) as (url, server_log), chromium_page() as (page, log):
        try:
            page.goto(f"{url}/lab/tree/{NOTEBOOK}")
            # Starting the kernel (torch import included) takes many seconds; keys pressed and
            # commands run before it is idle are silently lost.
            page.locator(".jp-StatusBar-Widget").get_by_text(KERNEL_IDLE).wait_for(timeout=180_000)
            # Not awaited: the command's promise settles only when the last cell has run.
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_function(RUN_FINISHED, arg=KERNEL_IDLE, timeout=300_000, polling=1000)
            check_notebook_ran(page)

            widget = widget_output(page)
            check_widget_shows_whole_run(widget)
            check_widget_responds(widget)
        except BaseException:
            page.screenshot(path=ARTIFACTS / "failure.png")
            print(f"console errors: {log.console_errors}\npage errors: {log.page_errors}\nblocked: {log.blocked}")
            print(f"JupyterLab's log:\n{server_log.read_text()[-6000:]}")
            raise

    assert not log.page_errors, "uncaught exceptions in the page:\n" + "\n".join(log.page_errors)
    assert not log.console_errors, "errors in the browser console:\n" + "\n".join(log.console_errors)
    unexpected = sorted(set(log.blocked) - EXPECTED_EXTERNAL.keys())
    assert not unexpected, f"the page needs resources from outside 127.0.0.1: {unexpected}"


def check_notebook_ran(page: Page) -> None:
    """Every code cell ran and none raised or wrote to stderr. JupyterLab renders an error as a
    stderr output, so in the DOM the two look alike; the notebook model tells which cell raised."""
    notebook = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON()")
    code_cells = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    raised = [f"cell {c['id']}: {o['ename']}: {o['evalue']}\n" + "\n".join(o["traceback"])
              for c in code_cells for o in c["outputs"] if o["output_type"] == "error"]
    assert not raised, "cells raised:\n" + "\n".join(raised)
    not_run = [c["id"] for c in code_cells if c["execution_count"] is None]
    assert not not_run, f"cells that did not run: {not_run}"
    stderr = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    assert stderr.count() == 0, "stderr output shown to the learner:\n" + "\n".join(stderr.all_inner_texts())
    failed = page.get_by_text("Error displaying widget")
    assert failed.count() == 0, "widgets failed to display:\n" + "\n".join(failed.all_inner_texts())


def widget_output(page: Page) -> Locator:
    """The CacheGrowth widget in its cell's output, once its controls and its chart have rendered."""
    cell = page.locator(".jp-CodeCell").filter(has=page.locator(".jp-InputArea-editor", has_text=WIDGET_CELL))
    expect(cell).to_have_count(1)
    widget = cell.locator(".jp-OutputArea-output .widget-vbox").first
    expect(widget.locator(".widget-toggle-buttons")).to_be_visible()
    expect(widget.locator(".widget-slider")).to_be_visible()
    expect(widget.locator(".js-plotly-plot .main-svg").first).to_be_visible()
    expect(widget.locator("text.ytitle")).to_have_text("KV cache (bytes)")

    widget.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / "01_kv_cache-page.png")
    widget.screenshot(path=ARTIFACTS / "cache_growth.png")
    return widget


def check_widget_shows_whole_run(widget: Locator) -> None:
    """Once `generate` has returned, the slider is at the run's last step and the chart shows it."""
    slider = widget.locator(".widget-slider")
    last = slider_bound(slider, "max")
    expect(slider.locator(".widget-readout"), "the step slider should end at the run's last step").to_have_text(last)
    expect(widget.locator("text.gtitle")).to_contain_text(f"after step {last}:")


def check_widget_responds(widget: Locator) -> None:
    """The toggle switches the chart to tokens; the slider takes it back to the run's first step.
    Both go through the kernel: the browser sends the control's value, the view redraws the figure."""
    widget.locator(".widget-toggle-button", has_text="tokens").click()
    expect(widget.locator("text.ytitle")).to_have_text("KV cache (tokens)")
    expect(widget.locator("text.gtitle")).to_contain_text(" tokens in use")
    widget.screenshot(path=ARTIFACTS / "cache_growth-tokens.png")

    slider = widget.locator(".widget-slider")
    first = slider_bound(slider, "min")
    slider.locator(".noUi-handle").press("Home")  # noUiSlider's keyboard support: to the minimum
    expect(slider.locator(".widget-readout")).to_have_text(first)
    expect(widget.locator("text.gtitle")).to_contain_text(f"after step {first}:")


def slider_bound(slider: Locator, bound: str) -> str:
    """The slider's "min" or "max" as its readout writes an integer; noUiSlider's handle carries
    it as an ARIA attribute such as "383.0"."""
    return str(round(float(slider.locator(".noUi-handle").get_attribute(f"aria-value{bound}") or "nan")))


def require_browser() -> None:
    if sync_playwright is None:
        missing = "playwright is not installed (pip install -e '.[dev]')"
    elif not CHROMIUM.is_file():
        missing = f"{CHROMIUM} is missing (apt-get install chromium fonts-dejavu-core)"
    else:
        return
    if os.environ.get("MINILLM_REQUIRE_BROWSER") == "1":
        pytest.fail(missing)
    pytest.skip(missing + "; MINILLM_REQUIRE_BROWSER=1 makes this a failure")


@contextlib.contextmanager
def jupyter_lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A JupyterLab on a free local port, open to anyone on this machine (no token, no XSRF check),
    serving a copy of the notebooks (the frontend autosaves into it, never into the repo); yields
    its URL and its log file, and stops it (and so its kernels) in the end."""
    served = tmp_path / "served"
    shutil.copytree(ROOT / "notebooks", served / "notebooks")
    dirs = {name: tmp_path / name for name in ("config", "data", "settings", "workspaces")}
    write_lab_settings(dirs["settings"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The learner's own Jupyter folders stay out: their kernelspecs (a "python3" there could point at
    # another Python), settings and workspaces. The kernel inherits the notebooks' test environment.
    env = {**os.environ, **NOTEBOOK_ENV, "JUPYTER_CONFIG_DIR": str(dirs["config"]),
           "JUPYTER_DATA_DIR": str(dirs["data"]), "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
           "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"])}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--ServerApp.root_dir={served}", "--IdentityProvider.token=",
           "--PasswordIdentityProvider.hashed_password=", "--ServerApp.disable_check_xsrf=True",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--ServerApp.allow_root=True"]  # CI containers run as root
    log_path = tmp_path / "jupyterlab.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(cmd, cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until_serving(url, server, log_path)
            yield url, log_path
        finally:
            # On SIGTERM the server shuts its kernels down before it exits; a kernel whose server was
            # killed exits on its own (it polls its parent's pid).
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def write_lab_settings(settings: Path) -> None:
    user_settings = {
        # Every cell in the DOM, not only those in the viewport, so that locators find them all.
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        # No "get notified about Jupyter news?" toast over the screenshots, and no update check.
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }
    for plugin, values in user_settings.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, server: subprocess.Popen, log_path: Path, timeout: float = 120) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    deadline = time.monotonic() + timeout
    while server.poll() is None:
        try:
            with opener.open(f"{url}/api/status", timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within {timeout:.0f}s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)  # polling interval, not a synchronisation
    pytest.fail(f"JupyterLab exited with {server.returncode}:\n{log_path.read_text()[-4000:]}")


@dataclass
class PageLog:
    """What the page did wrong: uncaught exceptions, console errors, and requests it was refused."""

    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def route(self, route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def on_console(self, message: ConsoleMessage) -> None:
        where = message.location.get("url", "")
        if message.type == "error" and where not in EXPECTED_EXTERNAL:
            self.console_errors.append(f"{message.text} ({where}:{message.location.get('lineNumber')})")

    def on_page_error(self, error: Error) -> None:
        self.page_errors.append(f"{error.name}: {error.message}\n{error.stack}")


@contextlib.contextmanager
def chromium_page() -> Iterator[tuple[Page, PageLog]]:
    """A headless Chromium page that can reach 127.0.0.1 only, and the log of what went wrong in it."""
    from playwright.sync_api import sync_playwright

    log = PageLog()
    # Waits of 5 s (the defaults of expect) are too short on a loaded 2-core machine: a redraw goes
    # through the kernel. The long waits set their own timeouts.
    expect.set_options(timeout=30_000)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 960})
            context.set_default_timeout(60_000)
            context.route("**/*", log.route)
            page = context.new_page()
            page.on("console", log.on_console)
            page.on("pageerror", log.on_page_error)
            yield page, log
        finally:
            browser.close()
            expect.set_options(timeout=None)  # back to playwright's default
