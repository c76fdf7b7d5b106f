"""minillm.widgets: the pure trace -> figure layer, and the live CacheGrowth view on a real engine.

Also run against Colab's ipywidgets 7.7.1 and plotly 5.24.1 by tests/course/test_widgets_colab.py, so
nothing here may depend on the main environment's versions.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable, Iterator

import ipywidgets
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.trace import SeqState, StepEvent, Trace, TraceInfo, record
from minillm.widgets import (
    CacheGrowth,
    cache_growth_figure,
    figure_host,
    format_bytes,
    format_percent,
    format_token,
    live,
    request_color,
)
from minillm.widgets.block_pool import FREE_COLOR
from minillm.widgets.colors import TOTAL_COLOR

BYTES_PER_TOKEN = 1024
INFO = TraceInfo(model="tiny", device="cpu", dtype="float32", kv_cache="contiguous",
                 kv_bytes_per_token=BYTES_PER_TOKEN, device_memory_bytes=16 * 10**9,
                 max_model_len=256, max_num_seqs=2)


def seq(request_id: str, kv: int, reserved: int, *, prefill: int = 0, finish: str | None = None) -> SeqState:
    return SeqState(request_id, prefill_tokens=prefill, decode_tokens=0 if prefill else 1, kv_tokens=kv,
                    kv_reserved_tokens=reserved, finish_reason=finish)


def hand_trace() -> Trace:
    """Two slots: "c" finishes in its first step, and "b", which waited, takes its slot; "a" runs
    steps 3-5 and "b" steps 4-6."""
    return Trace(INFO, [
        StepEvent(3, (seq("a", 5, 9, prefill=5), seq("c", 2, 3, prefill=2, finish="stop")), num_waiting=1),
        StepEvent(4, (seq("a", 6, 9), seq("b", 7, 12, prefill=7)), num_waiting=0),
        StepEvent(5, (seq("a", 7, 9, finish="length"), seq("b", 8, 12)), num_waiting=0),
        StepEvent(6, (seq("b", 9, 12, finish="stop"),), num_waiting=0),
    ])


def lines(fig: go.Figure, name: str) -> list[go.Scatter]:
    return [t for t in fig.data if t.name == name]


def used(fig: go.Figure, name: str) -> go.Scatter:
    return next(t for t in lines(fig, name) if t.line.dash == "solid")


def reserved(fig: go.Figure, name: str) -> go.Scatter:
    return next(t for t in lines(fig, name) if t.line.dash == "dash")


def assert_figure_matches(fig: go.Figure, trace: Trace, per_token: int) -> None:
    """Every line's numbers are the trace's numbers (times `per_token`), step for step."""
    x = [e.step for e in trace.events]
    for request_id in trace.request_ids:
        at = {e.step: s for e in trace.events for s in e.seqs if s.request_id == request_id}
        for line, field in ((used(fig, f"request {request_id}"), "kv_tokens"),
                            (reserved(fig, f"request {request_id}"), "kv_reserved_tokens")):
            assert list(line.x) == x
            assert list(line.y) == [getattr(at[s], field) * per_token if s in at else None for s in x]
    assert list(used(fig, "total in use").y) == [e.kv_tokens * per_token for e in trace.events]
    assert list(reserved(fig, "total reserved").y) == [e.kv_reserved_tokens * per_token for e in trace.events]


# ---- formatting and colours ----

@pytest.mark.parametrize("n, text", [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (66_048, "66.0 kB"),
                                     (1_234_567, "1.2 MB"), (999_960, "1.0 MB"), (16 * 10**9, "16.0 GB")])
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize("fraction, text", [(0, "0%"), (5.2e-7, "0.000052%"), (0.123, "12%"), (1, "100%")])
def test_format_percent(fraction: float, text: str) -> None:
    assert format_percent(fraction) == text


@pytest.mark.parametrize("token, label", [
    ("\n   ", "\\n␣␣␣"), ("\n       ", "\\n␣×7"), ("\n\n       ", "\\n\\n␣×7"), (" ", "␣"), ("\n", "\\n"),
    (" the", "␣the"), ("    return", "␣×4return"), ("a\tb", "a\\tb"), ("\x00", "\\x00"), ("é", "é"), ("", "")])
def test_format_token_shows_whitespace(token: str, label: str) -> None:
    assert format_token(token) == label


def test_format_token_tells_chapter_00s_top_tokens_apart() -> None:
    """The tiny model's ten likeliest tokens after "def fibonacci(n):" are a newline and runs of
    spaces; drawn as an SVG label collapses them (every run of spaces to one), four read the same."""
    tokens = ["\n   ", "\n       ", "\n               ", "\n           ", "\n                   ",
              "\n                       ", "\n                           ", " ", "\n", "\n\n       "]
    labels = [format_token(t) for t in tokens]
    assert len({" ".join(label.split()) for label in labels}) == len(tokens)  # distinct, even collapsed
    assert not any(c.isspace() for label in labels for c in label)


def srgb_to_lab(color: str) -> tuple[float, float, float]:
    """CIELAB (D65) of a "#rrggbb" colour, by the sRGB and CIE formulas."""
    rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    # Rows of the sRGB -> XYZ matrix, each with the D65 white point's coordinate that scales it.
    rows = ((0.4124, 0.3576, 0.1805, 0.95047), (0.2126, 0.7152, 0.0722, 1.0), (0.0193, 0.1192, 0.9505, 1.08883))
    xyz = [(x * r + y * g + z * b) / white for x, y, z, white in rows]
    fx, fy, fz = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in xyz]
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def color_difference(a: str, b: str) -> float:
    """CIE76 delta E: 2.3 is just noticeable; 20 and more tells two squares apart at a glance."""
    return sum((x - y) ** 2 for x, y in zip(srgb_to_lab(a), srgb_to_lab(b))) ** 0.5


def test_32_requests_in_a_row_get_clearly_different_colors() -> None:
    """Chapter 04 runs 24 requests, 8 at a time; a palette of 10 gave requests 0 and 10, 1 and 11,
    5 and 15 the same colour. Any 32 consecutive ids now differ, from each other and from the free
    block's grey and the total lines' near-black."""
    for start in (0, 24, 1000):
        colors = [request_color(str(i)) for i in range(start, start + 32)]
        others = [FREE_COLOR, TOTAL_COLOR]
        closest = min(color_difference(a, b) for i, a in enumerate(colors) for b in colors[i + 1:] + others)
        assert closest >= 20, f"two of requests {start}-{start + 31} look alike (delta E {closest:.1f})"
    assert color_difference("#636EFA", "#636EFA") == 0 and round(color_difference("#000000", "#FFFFFF")) == 100


def test_request_colors_are_stable_and_distinct() -> None:
    assert len({request_color(str(i)) for i in range(32)}) == 32  # a batch of 32 is all different
    assert request_color("7") == request_color("7") and request_color("x-1") == request_color("x-1")
    # The colour depends on the id only: the same request looks the same in any trace, in any unit.
    fig = cache_growth_figure(hand_trace(), unit="tokens")
    alone = cache_growth_figure(Trace(INFO, hand_trace().events[1:]), unit="bytes")
    for request_id in "ab":
        assert {t.line.color for t in lines(fig, f"request {request_id}")} == {request_color(request_id)}
        assert used(alone, f"request {request_id}").line.color == request_color(request_id)


# ---- the pure figure ----

def test_figure_numbers_are_the_traces() -> None:
    trace = hand_trace()
    assert_figure_matches(cache_growth_figure(trace, unit="tokens"), trace, per_token=1)
    assert_figure_matches(cache_growth_figure(trace, unit="bytes"), trace, per_token=BYTES_PER_TOKEN)
    fig = cache_growth_figure(trace, unit="tokens")
    assert list(used(fig, "request b").y) == [None, 7, 8, 9]  # a gap while it waited, not a zero
    assert fig.layout.yaxis.title.text == "KV cache (tokens)"
    assert cache_growth_figure(trace).layout.yaxis.title.text == "KV cache (bytes)"


def test_share_of_device_memory_axis_reads_the_same_lines() -> None:
    for unit, bytes_per_unit in (("tokens", BYTES_PER_TOKEN), ("bytes", 1)):
        fig = cache_growth_figure(hand_trace(), unit=unit)
        top = fig.layout.yaxis.range[1]
        assert top >= 21 * BYTES_PER_TOKEN / bytes_per_unit  # the highest line (21 reserved) fits
        share = top * bytes_per_unit / INFO.device_memory_bytes * 100
        assert fig.layout.yaxis2.range[1] == pytest.approx(share)
        assert "16.0 GB" in fig.layout.yaxis2.title.text


def test_caption_and_hover_give_the_numbers() -> None:
    fig = cache_growth_figure(hand_trace(), unit="tokens")
    assert ("after step 6: 1 running, 0 waiting · 9 tokens in use, 12 tokens reserved = "
            f"{format_percent(12 * BYTES_PER_TOKEN / INFO.device_memory_bytes)} of device memory"
            in fig.layout.title.text)
    assert used(fig, "request a").text[0] == "5 tokens = 5.1 kB"


def test_scrubbing_shows_a_prefix_in_the_same_frame() -> None:
    trace = hand_trace()
    whole, early = cache_growth_figure(trace), cache_growth_figure(trace, step=4)
    assert_figure_matches(early, Trace(INFO, trace.events[:2]), per_token=BYTES_PER_TOKEN)
    assert early.layout.xaxis.range == whole.layout.xaxis.range == (3, 6)
    assert early.layout.yaxis.range == whole.layout.yaxis.range
    assert "after step 4" in early.layout.title.text
    first = cache_growth_figure(trace, step=3)
    assert [t.name for t in first.data] == [t.name for t in whole.data]  # the same lines, so
    assert list(used(first, "request b").y) == [None]  # "b", not there yet, has an empty one


def test_reserved_lines_only_where_the_cache_reserves_more() -> None:
    exact = Trace(INFO, [StepEvent(0, (seq("a", 4, 4, prefill=4),), 0)])
    fig = cache_growth_figure(exact)
    assert [t.name for t in fig.data if t.yaxis != "y2"] == ["request a", "total in use"]
    no_cache = Trace(TraceInfo(**{**vars(INFO), "kv_cache": "none"}), [StepEvent(0, (seq("a", 0, 0),), 0)])
    assert "no KV cache" in cache_growth_figure(no_cache).layout.title.text


def test_figure_is_deterministic_and_checks_its_unit() -> None:
    first, again = cache_growth_figure(hand_trace()), cache_growth_figure(hand_trace())
    assert first.to_plotly_json() == again.to_plotly_json()
    assert cache_growth_figure(Trace(INFO)).layout.title.text.endswith("no steps yet</sup>")
    with pytest.raises(ValueError, match="unit must be one of"):
        cache_growth_figure(hand_trace(), unit="kB")


def test_pure_layer_does_not_import_ipywidgets() -> None:
    code = ("import sys, minillm.widgets as w; w.cache_growth_figure; "
            "assert 'ipywidgets' not in sys.modules, 'the pure layer imported ipywidgets'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- the view, on a recorded trace ----

def test_view_of_a_recorded_trace() -> None:
    view = CacheGrowth.from_trace(hand_trace())
    assert repr(view) == "CacheGrowth(steps=4, requests=3, peak=15.4 kB)"
    assert not view.attached
    # The trace starts at the engine's step 3; the view counts from the run's first step.
    assert (view.step_slider.min, view.step_slider.max, view.step_slider.value) == (0, 3, 3)
    assert [e.step for e in view.trace.events] == [0, 1, 2, 3] and hand_trace().events[0].step == 3
    assert_figure_matches(view.figure(), view.trace, per_token=BYTES_PER_TOKEN)
    assert isinstance(view, ipywidgets.VBox) and view.plot in view.children


def test_unit_toggle_changes_the_chart() -> None:
    view = CacheGrowth(hand_trace(), unit="tokens")
    assert isinstance(view.unit_toggle, ipywidgets.ToggleButtons)
    assert shown(view).layout.yaxis.title.text == "KV cache (tokens)"
    view.unit_toggle.value = "bytes"
    assert shown(view).layout.yaxis.title.text == "KV cache (bytes)"
    assert_figure_matches(shown(view), view.trace, per_token=BYTES_PER_TOKEN)
    assert repr(view) == "CacheGrowth(steps=4, requests=3, peak=15.4 kB)"
    view.unit_toggle.value = "tokens"
    assert repr(view) == "CacheGrowth(steps=4, requests=3, peak=15 tokens)"
    with pytest.raises(ValueError, match="unit must be one of"):
        CacheGrowth(hand_trace(), unit="kB")


def test_step_slider_scrubs_the_chart() -> None:
    view = CacheGrowth(hand_trace())
    view.step_slider.value = 1
    assert list(used(shown(view), "total in use").x) == [0, 1]
    view.step_slider.value = 3
    assert list(used(shown(view), "total in use").x) == [0, 1, 2, 3]


def test_output_fallback_when_figure_widget_cannot_be_built(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_figure_widget() -> None:
        raise ImportError("Please install anywidget to use the FigureWidget class")

    monkeypatch.setattr(figure_host.go, "FigureWidget", no_figure_widget)
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")
    view = CacheGrowth(hand_trace())
    assert isinstance(view.plot, ipywidgets.Output)
    assert_figure_matches(shown(view), view.trace, per_token=BYTES_PER_TOKEN)
    view.unit_toggle.value = "tokens"
    assert len(view.plot.outputs) == 1  # replaced, not appended
    assert_figure_matches(shown(view), view.trace, per_token=1)


def test_output_on_colab(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.colab", sys.modules[__name__])  # any module will do
    assert isinstance(CacheGrowth(hand_trace()).plot, ipywidgets.Output)


def test_not_a_trace_or_an_engine() -> None:
    with pytest.raises(TypeError, match="follows an LLM or LLMEngine; got str"):
        CacheGrowth("tiny")


def shown(view: CacheGrowth) -> go.Figure:
    """The figure the view shows right now, whichever widget holds it."""
    if isinstance(view.plot, ipywidgets.Output):
        (output,) = view.plot.outputs
        return go.Figure(output["data"]["application/vnd.plotly.v1+json"])
    return go.Figure(view.plot)


# ---- the view, live on a real engine ----

PROMPTS = ["Once upon a time", "The little dog"]
PARAMS = [SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
          SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)]  # 6 steps, the first ends at 3


Follow = Callable[..., CacheGrowth]
StepsApart = Callable[[float, CacheGrowth], list[int]]


@pytest.fixture
def follow(tiny_llm: LLM) -> Iterator[Follow]:
    """Live views on the shared engine, detached after the test whatever happens in it."""
    views: list[CacheGrowth] = []

    def make(**kwargs: float) -> CacheGrowth:
        views.append(CacheGrowth(tiny_llm, **kwargs))
        return views[-1]

    yield make
    for view in views:
        view.detach()


@pytest.fixture
def steps_apart(tiny_llm: LLM, monkeypatch: pytest.MonkeyPatch) -> Iterator[StepsApart]:
    """`steps_apart(seconds, view)`: the view's clock moves `seconds` now and between engine steps,
    and stands still otherwise; returns, per step, how many steps the view showed after it."""
    now = [0.0]
    monkeypatch.setattr(live, "monotonic", lambda: now[0])
    probes: list[Callable[[StepEvent], None]] = []

    def start(seconds: float, view: CacheGrowth) -> list[int]:
        shown_steps: list[int] = []

        def probe(event: StepEvent) -> None:
            # Listeners run in order: this one sees what the view has just drawn for this step.
            shown_steps.append(len(used(shown(view), "total in use").x))
            now[0] += seconds

        probes.append(probe)
        tiny_llm.llm_engine.step_listeners.append(probe)
        now[0] += seconds
        return shown_steps

    yield start
    for probe in probes:
        tiny_llm.llm_engine.step_listeners.remove(probe)


def test_live_view_redraws_while_generate_runs(tiny_llm: LLM, follow: Follow, steps_apart: StepsApart) -> None:
    view = follow()
    shown_steps = steps_apart(1.0, view)  # slower than min_interval: every step is drawn
    with record(tiny_llm) as trace:
        tiny_llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert shown_steps == [1, 2, 3, 4, 5, 6]
    assert view.trace.events == from_step_0(trace).events
    assert_figure_matches(shown(view), view.trace, per_token=trace.info.kv_bytes_per_token)
    assert_figure_matches(cache_growth_figure(trace, unit="tokens"), trace, per_token=1)
    first = used(shown(view), f"request {trace.request_ids[0]}")
    assert list(first.y)[3:] == [None] * 3  # its line ends when it finishes


def test_live_view_throttles_but_always_draws_the_end(tiny_llm: LLM, follow: Follow, steps_apart: StepsApart) -> None:
    view = follow(min_interval=1.0)
    assert view.attached and repr(view) == "CacheGrowth(steps=0, requests=0, peak=0 B)"
    shown_steps = steps_apart(0.25, view)
    tiny_llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert shown_steps == [0, 0, 0, 4, 4, 6]  # a second after the last draw, and the run's end
    assert view.step_slider.value == view.step_slider.max == view.trace.events[-1].step
    view.step_slider.value -= 2  # a learner scrubs back while the next run goes on
    tiny_llm.generate(PROMPTS[:1], PARAMS[:1], use_tqdm=False)
    assert view.step_slider.max == view.trace.events[-1].step
    assert view.step_slider.value == view.step_slider.max - 5  # left where the learner put it


def test_detach_stops_updates(tiny_llm: LLM, follow: Follow) -> None:
    with follow() as view:
        tiny_llm.generate(PROMPTS[:1], PARAMS[:1], use_tqdm=False)
    assert not view.attached
    before, drawn = list(view.trace.events), shown(view).to_plotly_json()
    assert_figure_matches(shown(view), view.trace, per_token=view.trace.info.kv_bytes_per_token)
    tiny_llm.generate(PROMPTS[:1], PARAMS[:1], use_tqdm=False)
    assert view.trace.events == before and shown(view).to_plotly_json() == drawn
    view.detach()  # twice is fine
    closed = CacheGrowth(tiny_llm.llm_engine)  # an LLMEngine does as well as an LLM
    assert closed.attached
    closed.close()  # closing the widget also stops following
    assert not closed.attached


def from_step_0(trace: Trace) -> Trace:
    """The trace with its steps counted from its first."""
    return Trace(trace.info, [dataclasses.replace(e, step=e.step - trace.events[0].step) for e in trace.events])


def test_steps_count_from_the_runs_first_step(tiny_llm: LLM, follow: Follow) -> None:
    """On an engine that has run before, a view's slider and chart start at step 0, not at the
    engine's own count (hundreds of steps into chapter 04); a recorded trace of it does the same."""
    tiny_llm.generate(PROMPTS, PARAMS, use_tqdm=False)  # the engine is 6 steps (and more) into its count
    view = follow()
    with record(tiny_llm) as trace:
        tiny_llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert trace.events[0].step >= 6
    for shows in (view, CacheGrowth(trace)):
        assert (shows.step_slider.min, shows.step_slider.value, shows.step_slider.max) == (0, 5, 5)
        assert shows.trace.events == from_step_0(trace).events
        assert list(used(shown(shows), "total in use").x) == [0, 1, 2, 3, 4, 5]
        assert shown(shows).layout.xaxis.range[0] == 0
