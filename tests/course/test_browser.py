"""The course's live views in a real browser: JupyterLab serves a copy of the notebooks, headless
Chromium runs all the cells of one, and its widget must show its controls and its plotly chart,
answer them, and leave no error in the notebook, the page or its console. Two chapters run whole:
CacheGrowth (01_kv_cache) answers its unit toggle and its step slider, QuantError (06_quantization)
its layer dropdown and its method toggle. The other views run in one short notebook written here
(their chapters' cells generate for minutes on a CPU), each view with its own engine, and each
answers its step slider, which starts at the run's step 0 whatever the engine ran before:
BlockPool follows an engine whose prefix cache already holds the requests' shared prompt (shared
and cached blocks), BatchSlots one given more requests than max_num_seqs (some wait), each of its 8
slots drawn tall enough to read, DraftAcceptance a speculating engine, ServingDashboard a server in
the kernel under a burst of requests sent with the openai client; and Roofline (chapter 08 measures
a larger model) shows a small `bench decode` run on the shipped model and answers its series toggle.

One JupyterLab and one Chromium serve the whole module (each start costs seconds on 2 cores); each
notebook gets its own browser context, and its kernels are shut down when its run ends.

Needs Debian's Chromium (/usr/bin/chromium) and playwright; without them the tests skip, unless
MINILLM_REQUIRE_BROWSER=1 (.ci/run sets it) makes that a failure. Screenshots are written to
artifacts/browser/<notebook>/, which CI keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import nbformat
import pytest
from notebook_runs import NOTEBOOK_ENV, ROOT

from minillm.models.loader import resolve_model_path
from minillm.quant import INT4_GROUP_SIZES
from minillm.widgets.batch_slots import FILL, ROW_PX

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # a learner's laptop without the dev extras: the tests skip (see require_browser)
    expect = sync_playwright = None

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Error, Locator, Page, Route

CHROMIUM = Path("/usr/bin/chromium")
# Headless as root on a machine without GPU or network: no sandbox (it needs an unprivileged
# user), no GPU process, no /dev/shm (small in containers), and no background fetches that can
# only fail.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                  "--disable-component-update"]
ARTIFACTS = ROOT / "artifacts" / "browser"  # a folder per notebook, each test clearing only its own
# QuantError's two rows of toggle buttons, told apart by their descriptions.
METHODS = '.widget-toggle-buttons:has(.widget-label:text-is("method"))'
GROUP_SIZES = '.widget-toggle-buttons:has(.widget-label:text-is("group size"))'
KERNEL_IDLE = "Python 3 (ipykernel) | Idle"  # JupyterLab's status bar once the kernel can take work
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}  # as the chapters'
# The cells of a notebook that shows DraftAcceptance live: the engine speculates with the draft model.
DRAFT_ACCEPTANCE_CELLS = [
    """import os

from minillm import LLM, SamplingParams
from minillm.widgets import DraftAcceptance

llm = LLM(os.environ["MINILLM_MODEL"],
          speculative_config={"model": os.environ["MINILLM_DRAFT_MODEL"], "num_speculative_tokens": 4})""",
    "draft_view = DraftAcceptance(llm)\ndraft_view",
    """params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
outputs = llm.generate(["def f(x):\\n    return x\\n\\ndef g(x):\\n", "The little dog"], params)""",
]

# The cells of a notebook that shows BlockPool live: a first request leaves its prompt's three full
# blocks in the prefix cache, then three requests with the same start share them.
BLOCK_POOL_CELLS = [
    """import os

from minillm import LLM, SamplingParams
from minillm.widgets import BlockPool

llm = LLM(os.environ["MINILLM_MODEL"], num_kv_blocks=32, max_model_len=128)  # prefix caching is on by default
system = list(range(10, 58))  # a 48-token system prompt: three blocks of 16 tokens
prompts = [{"prompt_token_ids": system + list(range(100 + 8 * i, 108 + 8 * i))} for i in range(4)]
params = SamplingParams(max_tokens=8, ignore_eos=True)
first = llm.generate(prompts[:1], params)""",
    "pool_view = BlockPool(llm)\npool_view",
    "outputs = llm.generate(prompts[1:], params)",
]

# The cells of a notebook that shows BatchSlots live: twelve requests of different lengths for eight
# slots, as in chapter 04, so four wait at first and each freed slot is refilled; tens of steps.
BATCH_SLOTS_CELLS = [
    """import os

from minillm import LLM, SamplingParams
from minillm.widgets import BatchSlots

llm = LLM(os.environ["MINILLM_MODEL"], max_num_seqs=8, max_model_len=128)""",
    "slots_view = BatchSlots(llm)\nslots_view",
    """prompts = [{"prompt_token_ids": list(range(10, 10 + n))} for n in (8, 20, 12, 16, 10, 14, 18, 9, 11, 13, 15, 17)]
params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (16, 40, 24, 12, 20, 48, 32, 28, 36, 16, 24, 44)]
outputs = llm.generate(prompts, params)""",
]

# The cells of a notebook that shows ServingDashboard live: a server in the kernel, a burst of requests
# from threads (more than max_num_seqs, so some wait), and the server stopped in the last cell.
SERVING_DASHBOARD_CELLS = [
    """import os
from concurrent.futures import ThreadPoolExecutor

import openai

from minillm.entrypoints.background import BackgroundServer
from minillm.widgets import ServingDashboard

model = os.environ["MINILLM_MODEL"]
server = BackgroundServer(model, max_num_seqs=4).start()
client = openai.OpenAI(base_url=server.base_url, api_key="none")""",
    "dashboard = ServingDashboard(server)\ndashboard",
    """def send(i):
    return client.completions.create(model=model, prompt=f"def f{i}(x):", max_tokens=16,
                                     extra_body={"ignore_eos": True})


with ThreadPoolExecutor(12) as pool:
    replies = list(pool.map(send, range(12)))""",
    "dashboard.detach()\nserver.stop()",
]

# The cells of a notebook that shows Roofline: a small `bench decode` of the shipped model (two batch
# sizes, two prompt lengths) and one linear layer of its shape timed alone.
ROOFLINE_CELLS = [
    """import os

import torch

from minillm.bench.decode import bench_decode, linear_rows
from minillm.widgets import Roofline

decode_rows, prefill_rows, summary = bench_decode(os.environ["MINILLM_MODEL"], batches=(1, 4), context=16, steps=3,
                                                  prefill_lens=(32, 128), device="cpu")
kernels = linear_rows(256, 768, (1, 16), torch.float32, "cpu", summary["copy_GB_s"] * 1e9)""",
    "roofline_view = Roofline(decode_rows, prefill_rows, summary, kernels=kernels)\nroofline_view",
]

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

# The five views, one after the other in one notebook: one kernel start and one torch import for all.
# Each view keeps its own name: a widget whose last reference goes away is closed, and the page
# then shows "model not found" in its place.
VIEW_CELLS = [*DRAFT_ACCEPTANCE_CELLS, *BLOCK_POOL_CELLS, *BATCH_SLOTS_CELLS, *SERVING_DASHBOARD_CELLS, *ROOFLINE_CELLS]

# A chapter's run takes about 25-50 s on an idle 2-core machine, the views' notebook about as long
# (the first test that needs it pays for it); the limit leaves room for a machine shared with other work.
pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(420)]


@dataclass
class Lab:
    """The module's JupyterLab (its URL, its log, the folder it serves) and Chromium."""

    url: str
    log: Path
    served: Path
    browser: Browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_browser()
    model = NOTEBOOK_ENV["MINILLM_MODEL"]
    if not (resolve_model_path(model) / "model.safetensors").is_file():
        pytest.fail(f"the notebook's model {model!r} is missing (minillm/assets/{model}/model.safetensors)")
    tmp = tmp_path_factory.mktemp("lab")
    with jupyter_lab(tmp) as (url, server_log), chromium() as browser:
        yield Lab(url, server_log, served_folder(tmp), browser)


@pytest.fixture(scope="module")
def views(lab: Lab) -> Iterator[tuple[Page, Path]]:
    """The five views' notebook, run once for the tests of the five views."""
    with notebook_run_in_lab(lab, write_notebook(lab.served, "views.ipynb", VIEW_CELLS)) as run:
        yield run


def test_cache_growth_renders_and_responds_in_jupyterlab(lab: Lab) -> None:
    with notebook_run_in_lab(lab, "notebooks/01_kv_cache.ipynb") as (page, shots):
        widget = widget_output(page, "view = CacheGrowth(cached)", shots, "cache_growth",
                               controls=(".widget-toggle-buttons", ".widget-slider"))
        check_cache_growth_shows_whole_run(widget)
        check_cache_growth_responds(widget, shots)
        check_next_link_opens_in_lab(page, "02 · The paged KV cache", "notebooks/02_paged_kv_cache.ipynb")


def test_quant_error_renders_and_responds_in_jupyterlab(lab: Lab) -> None:
    with notebook_run_in_lab(lab, "notebooks/06_quantization.ipynb") as (page, shots):
        widget = widget_output(page, "QuantError(llm, ", shots, "quant_error",
                               controls=(".widget-dropdown select", METHODS, GROUP_SIZES))
        check_quant_error_responds(widget, shots)


def test_draft_acceptance_renders_and_responds_in_jupyterlab(views: tuple[Page, Path]) -> None:
    page, shots = views
    with shot_on_failure(page, shots, "draft_acceptance"):
        widget = widget_output(page, "draft_view = DraftAcceptance(llm)", shots, "draft_acceptance",
                               controls=(".widget-slider",))
        check_draft_acceptance_responds(widget, shots)


def test_block_pool_renders_and_responds_in_jupyterlab(views: tuple[Page, Path]) -> None:
    page, shots = views
    with shot_on_failure(page, shots, "block_pool"):
        widget = widget_output(page, "pool_view = BlockPool(llm)", shots, "block_pool", controls=(".widget-slider",))
        title = widget.locator("text.gtitle")
        shared = widget.locator(".scatterlayer .textpoint").get_by_text("3", exact=True)  # a block's sharer count
        # In the end every request has finished: no block is held, the three prompt blocks stay cached.
        expect(title).to_contain_text("KV block pool · 32 blocks of 16 tokens")
        expect(title).to_contain_text(" 0 held (0 B), 32 free, 3 cached · ")
        expect(shared).to_have_count(0)
        check_slider_scrubs(widget, shots, "block_pool", lambda step: f"after step {step}: ")
        # The first step: the three requests share the cached blocks, and the rest of their prompts hit.
        expect(shared).to_have_count(3)
        expect(title).to_contain_text("prefix hits 144 tokens")


def test_batch_slots_renders_and_responds_in_jupyterlab(views: tuple[Page, Path]) -> None:
    page, shots = views
    with shot_on_failure(page, shots, "batch_slots"):
        widget = widget_output(page, "slots_view = BatchSlots(llm)", shots, "batch_slots", controls=(".widget-slider",))
        title = widget.locator("text.gtitle")
        squares = widget.locator(".js-plotly-plot .barlayer .point")  # one per request and step
        expect(title).to_contain_text("Batch slots · 8 of max_num_seqs=8 used")
        expect(title).to_contain_text(", 0 waiting · ")
        whole_run = squares.count()
        check_slots_readable(widget, squares, slots=8)
        check_slider_scrubs(widget, shots, "batch_slots", lambda step: f"step {step}: ")
        # The first eight prompts hold 107 tokens; the 18-token one finds the first block of the 20-token
        # one, which the same step computes (prompts share their blocks within a step), so 91 are computed.
        expect(title).to_contain_text("8 running, 91 prefill + 0 decode tokens, 4 waiting")
        assert squares.count() < whole_run, "the first step should show fewer squares than the whole run"


def test_serving_dashboard_renders_and_responds_in_jupyterlab(views: tuple[Page, Path]) -> None:
    page, shots = views
    with shot_on_failure(page, shots, "serving_dashboard"):
        widget = widget_output(page, "dashboard = ServingDashboard(server)", shots, "serving_dashboard",
                               controls=(".widget-slider",))
        title = widget.locator("text.gtitle")
        expect(title).to_contain_text(f"Serving · {NOTEBOOK_ENV['MINILLM_MODEL']} on cpu, max_num_seqs=4")
        expect(widget.locator("text.ytitle")).to_have_text("requests")  # the top panel's; y4title: the bottom's
        expect(widget.locator("text.y4title")).to_have_text("tokens/s")
        # The first step follows idle time (the server had just started): its caption says so.
        check_slider_scrubs(widget, shots, "serving_dashboard", lambda step: f"step {step} at ")
        expect(title).to_contain_text("at 0.0 s, after idle time: ")


def test_roofline_renders_and_responds_in_jupyterlab(views: tuple[Page, Path]) -> None:
    page, shots = views
    with shot_on_failure(page, shots, "roofline"):
        widget = widget_output(page, "roofline_view = Roofline(", shots, "roofline",
                               controls=(".widget-toggle-buttons",))
        check_roofline_responds(widget, shots)


@contextlib.contextmanager
def notebook_run_in_lab(lab: Lab, notebook: str) -> Iterator[tuple[Page, Path]]:
    """Opens `notebook` in JupyterLab in a fresh browser context, runs all its cells and checks they
    ran cleanly; yields the page and the notebook's screenshot folder (emptied first). Whatever fails,
    in the notebook or in the caller's checks, leaves failure.png there and the page's and the
    server's logs in the test's output; in the end no page error, console error or outside request
    may remain, and the notebook's kernels (and any it opened, following a link) are shut down."""
    shots = ARTIFACTS / Path(notebook).stem
    shutil.rmtree(shots, ignore_errors=True)  # screenshots of an earlier run must not pass for this one's
    shots.mkdir(parents=True)

    try:
        with browser_page(lab.browser) as (page, log):
            try:
                # A workspace of its own, reset: the shared server's default one would reopen the
                # notebooks of earlier runs beside this one (their saved widget outputs then show
                # "model not found", and their unrun cells keep the run from looking finished).
                page.goto(f"{lab.url}/lab/workspaces/{Path(notebook).stem}/tree/{notebook}?reset")
                # Starting the kernel (torch import included) takes many seconds; keys pressed and
                # commands run before it is idle are silently lost.
                page.locator(".jp-StatusBar-Widget").get_by_text(KERNEL_IDLE).wait_for(timeout=180_000)
                # Not awaited: the command's promise settles only when the last cell has run.
                page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
                page.wait_for_function(RUN_FINISHED, arg=KERNEL_IDLE, timeout=300_000, polling=1000)
                check_notebook_ran(page)
                yield page, shots
            except BaseException:
                page.screenshot(path=shots / "failure.png")
                print(f"console errors: {log.console_errors}\npage errors: {log.page_errors}\nblocked: {log.blocked}")
                print(f"JupyterLab's log:\n{lab.log.read_text()[-6000:]}")
                raise
    finally:
        shut_down_kernels(lab.url)

    assert not log.page_errors, "uncaught exceptions in the page:\n" + "\n".join(log.page_errors)
    assert not log.console_errors, "errors in the browser console:\n" + "\n".join(log.console_errors)
    unexpected = sorted(set(log.blocked) - EXPECTED_EXTERNAL.keys())
    assert not unexpected, f"the page needs resources from outside 127.0.0.1: {unexpected}"


@contextlib.contextmanager
def shot_on_failure(page: Page, shots: Path, name: str) -> Iterator[None]:
    """For the checks of one view of a shared run: a failure leaves <name>-failure.png."""
    try:
        yield
    except BaseException:
        page.screenshot(path=shots / f"{name}-failure.png")
        raise


def check_next_link_opens_in_lab(page: Page, title: str, path: str) -> None:
    """The chapter's local "Next" link opens the next chapter in a JupyterLab tab (its Colab twin would
    leave JupyterLab, and the page may not reach Colab: the route guard would record it)."""
    next_line = page.locator(".jp-RenderedMarkdown strong").filter(has_text=f"Next: {title}")
    next_line.get_by_role("link", name=title, exact=True).click()
    page.wait_for_function("path => window.jupyterapp.shell.currentWidget?.context?.path === path", arg=path,
                           timeout=60_000)


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


def widget_output(page: Page, cell_source: str, shots: Path, name: str, controls: tuple[str, ...]) -> Locator:
    """The widget in the output of the one cell whose source contains `cell_source`, once its
    `controls` (selectors) and its plotly chart have rendered; the page around it and the widget
    are saved as <name>-page.png and <name>.png."""
    cell = page.locator(".jp-CodeCell").filter(has=page.locator(".jp-InputArea-editor", has_text=cell_source))
    expect(cell).to_have_count(1)
    widget = cell.locator(".jp-OutputArea-output .widget-vbox").first
    for control in controls:
        expect(widget.locator(control)).to_be_visible()
    expect(widget.locator(".js-plotly-plot .main-svg").first).to_be_visible()

    widget.scroll_into_view_if_needed()
    page.screenshot(path=shots / f"{name}-page.png")
    widget.screenshot(path=shots / f"{name}.png")
    return widget


def check_cache_growth_shows_whole_run(widget: Locator) -> None:
    """Once `generate` has returned, the slider is at the run's last step and the chart shows it."""
    expect(widget.locator("text.ytitle")).to_have_text("KV cache (bytes)")
    slider = widget.locator(".widget-slider")
    last = slider_bound(slider, "max")
    expect(slider.locator(".widget-readout"), "the step slider should end at the run's last step").to_have_text(last)
    expect(widget.locator("text.gtitle")).to_contain_text(f"after step {last}:")


def check_cache_growth_responds(widget: Locator, shots: Path) -> None:
    """The toggle switches the chart to tokens; the slider takes it back to the run's first step.
    Both go through the kernel: the browser sends the control's value, the view redraws the figure."""
    widget.locator(".widget-toggle-button", has_text="tokens").click()
    expect(widget.locator("text.ytitle")).to_have_text("KV cache (tokens)")
    expect(widget.locator("text.gtitle")).to_contain_text(" tokens in use")
    widget.screenshot(path=shots / "cache_growth-tokens.png")

    slider = widget.locator(".widget-slider")
    first = slider_bound(slider, "min")
    slider.locator(".noUi-handle").press("Home")  # noUiSlider's keyboard support: to the minimum
    expect(slider.locator(".widget-readout")).to_have_text(first)
    expect(widget.locator("text.gtitle")).to_contain_text(f"after step {first}:")


def check_quant_error_responds(widget: Locator, shots: Path) -> None:
    """The notebook's choice (int4, its group size, layer 0's down_proj) is drawn; picking another
    layer in the dropdown redraws the chart for it, and the int8 toggle redraws it as int8 and
    disables the group sizes, which int8 does not use. Each goes through the kernel."""
    layers = widget.locator(".widget-dropdown select")
    title = widget.locator("text.gtitle")  # e.g. "model.layers.0.mlp.down_proj · int4, groups of 128 inputs · ..."
    group_sizes = widget.locator(GROUP_SIZES)
    first, other = "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.qkv_proj"
    # An option's value is its label, the layer's name and shape: "model.layers.0.mlp.down_proj (256×768)".
    expect(layers).to_have_value(re.compile(rf"^{re.escape(first)} \("))
    expect(title).to_contain_text(f"{first} · int4, groups of ")
    expect(widget.get_by_text("Cannot draw this")).to_have_count(0)
    expect(group_sizes.locator("button:enabled")).to_have_count(len(INT4_GROUP_SIZES))

    layers.select_option(layers.locator(f'option[value^="{other} ("]').get_attribute("value"))
    expect(title).to_contain_text(f"{other} · int4, groups of ")
    widget.screenshot(path=shots / "quant_error-layer.png")

    widget.locator(METHODS).locator(".widget-toggle-button", has_text="int8").click()
    expect(title).to_contain_text(f"{other} · int8, one scale per output channel")
    expect(group_sizes.locator("button:disabled")).to_have_count(len(INT4_GROUP_SIZES))
    expect(widget.get_by_text("Cannot draw this")).to_have_count(0)
    widget.screenshot(path=shots / "quant_error-int8.png")


def check_draft_acceptance_responds(widget: Locator, shots: Path) -> None:
    """Once `generate` has returned, the chart shows the run's drafts up to its last step; the slider
    takes it back to the first step, the prompts' prefill, where nothing has been drafted yet."""
    title = widget.locator("text.gtitle")  # e.g. "Draft acceptance · draft_model, k=4 ... after step 11: α so far 0.64"
    points = widget.locator(".js-plotly-plot .scatterlayer .point")  # the grid's squares and dots
    slider = widget.locator(".widget-slider")
    last, first = slider_bound(slider, "max"), slider_bound(slider, "min")
    expect(slider.locator(".widget-readout")).to_have_text(last)
    expect(title).to_contain_text("Draft acceptance · draft_model, k=4")
    expect(title).to_contain_text(f"after step {last}: α so far ")
    expect(points).not_to_have_count(0)
    # The first draw, before any step, was a notice; nothing of it may linger over the chart.
    expect(widget.locator(".js-plotly-plot .annotation")).to_have_count(0)

    slider.locator(".noUi-handle").press("Home")
    expect(slider.locator(".widget-readout")).to_have_text(first)
    expect(title).to_contain_text(f"after step {first}: no drafts yet")
    expect(points).to_have_count(0)
    widget.screenshot(path=shots / "draft_acceptance-first-step.png")


def check_roofline_responds(widget: Locator, shots: Path) -> None:
    """All six points are drawn under the measured roofs (2 decode steps, 2 prefills, 2 kernels);
    the toggle's "prefill" redraws the chart with the prefill points alone, and "all" brings the
    rest back. Each goes through the kernel."""
    title = widget.locator("text.gtitle")  # "Roofline · cpu, float32: copy ... GB/s, ... showing all: 6 points; ..."
    points = widget.locator(".js-plotly-plot .scatterlayer .point")  # markers only: the roofs are lines
    expect(title).to_contain_text("Roofline · cpu, float32: copy ")
    expect(title).to_contain_text("showing all: 6 points")
    expect(points).to_have_count(6)
    expect(widget.locator("text.xtitle")).to_have_text("arithmetic intensity (flop per byte moved)")

    widget.locator(".widget-toggle-button", has_text="prefill").click()
    expect(title).to_contain_text("showing prefill: 2 points")
    expect(points).to_have_count(2)
    widget.screenshot(path=shots / "roofline-prefill.png")

    widget.locator(".widget-toggle-button", has_text="all").click()
    expect(title).to_contain_text("showing all: 6 points")
    expect(points).to_have_count(6)


def check_slots_readable(widget: Locator, squares: Locator, slots: int) -> None:
    """As drawn on the page, each slot has its ROW_PX pixels and each square is FILL of them tall,
    however many steps share the width: 8 slots of a long run once got about 50 px between them."""
    plot_px = widget.locator(".js-plotly-plot .nsewdrag").first.bounding_box()["height"]
    assert plot_px >= slots * ROW_PX - 1, f"{slots} slots drawn in {plot_px:.0f} px, under {ROW_PX} px each"
    heights = squares.evaluate_all("els => els.map(e => e.getBoundingClientRect().height)")
    assert heights and min(heights) >= ROW_PX * FILL - 1, f"squares {min(heights):.0f} px tall, not {ROW_PX * FILL:.0f}"


def check_slider_scrubs(widget: Locator, shots: Path, name: str, caption: Callable[[str], str]) -> None:
    """Once the run is over, the slider is at its last step and the title's caption (`caption(step)`)
    says so; the slider's Home key takes both back to the first step, 0, through the kernel."""
    title = widget.locator("text.gtitle")
    slider = widget.locator(".widget-slider")
    last, first = slider_bound(slider, "max"), slider_bound(slider, "min")
    assert first == "0", f"the slider should start at the run's first step, 0, not at the engine's step {first}"
    assert first != last, "the run should have more than one step"
    expect(slider.locator(".widget-readout")).to_have_text(last)
    expect(title).to_contain_text(caption(last))
    slider.locator(".noUi-handle").press("Home")
    expect(slider.locator(".widget-readout")).to_have_text(first)
    expect(title).to_contain_text(caption(first))
    widget.screenshot(path=shots / f"{name}-first-step.png")


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


def served_folder(tmp_path: Path) -> Path:
    return tmp_path / "served"


def write_notebook(served: Path, name: str, cells: list[str]) -> str:
    """A notebook of these code cells, served beside the chapters' copies (for views no chapter
    shows quickly); returns its path for `notebook_run_in_lab`."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells],
                                  metadata={"kernelspec": KERNELSPEC})  # without one, Lab asks which kernel
    path = served / "written" / name
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return f"written/{name}"


@contextlib.contextmanager
def jupyter_lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A JupyterLab on a free local port, open to anyone on this machine (no token, no XSRF check),
    serving a copy of the notebooks and those `write_notebook` wrote (the frontend autosaves into
    them, never into the repo); yields its URL and its log file, and stops it (and so its kernels)
    in the end."""
    served = served_folder(tmp_path)
    shutil.copytree(ROOT / "notebooks", served / "notebooks")
    dirs = {name: tmp_path / name for name in ("config", "data", "settings", "workspaces")}
    write_lab_settings(dirs["settings"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The learner's own Jupyter folders stay out: their kernelspecs (a "python3" there could point at
    # another Python), settings and workspaces. The kernel inherits the notebooks' test environment,
    # and its temporary files stay in this test's folder.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, **NOTEBOOK_ENV, "TMPDIR": str(tmp_path / "tmp"), "JUPYTER_CONFIG_DIR": str(dirs["config"]),
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


def shut_down_kernels(url: str) -> None:
    """Every kernel of the shared JupyterLab, shut down through its REST API: a finished notebook's
    engine must not hold memory and threads while the next notebook runs."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/api/kernels", timeout=30) as reply:
        kernels = json.load(reply)
    for kernel in kernels:
        opener.open(urllib.request.Request(f"{url}/api/kernels/{kernel['id']}", method="DELETE"), timeout=60).close()


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
def chromium() -> Iterator[Browser]:
    """A headless Chromium, for the module's pages."""
    from playwright.sync_api import sync_playwright

    # Waits of 5 s (the defaults of expect) are too short on a loaded 2-core machine: a redraw goes
    # through the kernel. The long waits set their own timeouts.
    expect.set_options(timeout=30_000)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()
            expect.set_options(timeout=None)  # back to playwright's default


@contextlib.contextmanager
def browser_page(browser: Browser) -> Iterator[tuple[Page, PageLog]]:
    """A page in a context of its own that can reach 127.0.0.1 only, and the log of what went wrong in it."""
    log = PageLog()
    # Tall enough for the tallest view (QuantError: its controls and a 980 px chart) to fit in the
    # notebook's panel: a widget screenshot shows only what is in the viewport.
    context = browser.new_context(viewport={"width": 1280, "height": 1440})
    try:
        context.set_default_timeout(60_000)
        context.route("**/*", log.route)
        page = context.new_page()
        page.on("console", log.on_console)
        page.on("pageerror", log.on_page_error)
        yield page, log
    finally:
        context.close()
