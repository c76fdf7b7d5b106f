"""ServingDashboard: every series worked out by hand on a hand-made trace with hand-made times (idle
gaps included), and live on a BackgroundServer under a burst of requests sent from threads. Also run
with Colab's widget versions (tests/course/test_widgets_colab.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import plotly.graph_objects as go
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.trace import SeqState, StepEvent, Trace, TraceInfo
from minillm.widgets import ServingDashboard, serving_dashboard_figure, serving_series
from minillm.widgets.serving_dashboard import generated_tokens

INFO = TraceInfo(model="tiny", device="cpu", dtype="float32", kv_cache="paged", kv_bytes_per_token=100,
                 device_memory_bytes=10**9, max_model_len=64, max_num_seqs=2, block_size=4, num_kv_blocks=10)


def seq(request_id: str, prefill: int = 0, *, finish: str | None = None, drafts: tuple[int, ...] = (),
        accepted: int = 0) -> SeqState:
    return SeqState(request_id, prefill_tokens=prefill, decode_tokens=0 if prefill else 1 + len(drafts), kv_tokens=0,
                    kv_reserved_tokens=0, finish_reason=finish, spec_token_ids=drafts, num_accepted_tokens=accepted)


def hand_run() -> tuple[Trace, list[float]]:
    # Steps 0-4 every 0.25 s but step 3 (0.5 s, "2"'s prompt): "1"'s prompt comes in two chunks, "2"
    # waits for "0"'s slot, and step 4 leaves the engine empty. Idle until step 5 (one token, so it
    # drains the engine again), and step 6 half a second later; then a 2.5 s gap with "4" still running
    # (no step says the engine emptied, but the gap is longer than IDLE_GAP), and a verify of 3 drafts
    # with 2 accepted.
    return Trace(INFO, [
        StepEvent(0, (seq("0", 8), seq("1", 4)), 1, num_free_blocks=6),
        StepEvent(1, (seq("0"), seq("1", 3)), 1, num_free_blocks=5),
        StepEvent(2, (seq("0", finish="length"), seq("1")), 1, num_free_blocks=7),
        StepEvent(3, (seq("1"), seq("2", 6)), 0, num_free_blocks=5),
        StepEvent(4, (seq("1", finish="length"), seq("2", finish="stop")), 0, num_free_blocks=10),
        StepEvent(5, (seq("3", 5, finish="length"),), 0, num_free_blocks=10),
        StepEvent(6, (seq("4", 4),), 0, num_free_blocks=9),
        StepEvent(7, (seq("4"),), 0, num_free_blocks=9),
        StepEvent(8, (seq("4", drafts=(1, 2, 3), accepted=2, finish="length"),), 0, num_free_blocks=10),
    ]), [10.0, 10.25, 10.5, 11.0, 11.25, 20.0, 20.5, 23.0, 23.25]


def lines(fig: go.Figure) -> dict[str, tuple[list, list]]:
    return {t.name: (list(t.x), list(t.y)) for t in fig.data}


def test_requests_blocks_and_intervals() -> None:
    s = serving_series(*hand_run())
    assert s.seconds == [0, 0.25, 0.5, 1, 1.25, 10, 10.5, 13, 13.25]
    assert s.running == [2, 2, 2, 2, 2, 1, 1, 1, 1]
    assert s.waiting == [1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert s.blocks_used == [4, 5, 3, 5, 0, 0, 1, 1, 0]
    # Busy periods start at step 0, after the steps that drained the engine (4 and 5), and after the gap.
    assert s.busy_start == [True, False, False, False, False, True, True, True, False]
    assert s.interval_ms == [None, 250, 250, 500, 250, None, None, None, 250]


def test_tokens_per_second() -> None:
    trace, times = hand_run()
    # A prompt's last chunk makes the first token (step 0 for "0"; step 1, not 0, for "1"; step 5 ends
    # "3" at once); a decode 1 token, the verify at step 8 3 (2 drafts and the target's own).
    assert generated_tokens(trace) == [1, 2, 2, 2, 2, 1, 1, 1, 3]
    assert sum(generated_tokens(trace)) == 15  # "0": 3 tokens, "1": 4, "2": 2, "3": 1, "4": 5
    s = serving_series(trace, times)
    # Tokens of the steps after the earliest event of the busy period at most a second back, over the
    # time since it: at step 3 (t=11.0) steps 1-3 over 1 s from step 0; at step 4 steps 2-4 from step
    # 1. Nothing where a busy period starts: how long that step took is unknown.
    assert s.generated_per_s == [None, 8, 8, 6, 6, None, None, None, 12]
    assert s.prefill_per_s == [None, 12, 6, 9, 6, None, None, None, 0]
    # Half a second back: step 3 alone over 0.5 s; at step 4, step 4 alone over 0.25 s.
    assert serving_series(trace, times, window=0.5).generated_per_s == [None, 8, 8, 4, 8, None, None, None, 12]
    # Until the step after a chunk is known, the chunk's token is not: a live view sees it one step late.
    assert generated_tokens(Trace(INFO, trace.events[:1])) == [0]


def test_figure_breaks_every_line_across_idle_time() -> None:
    fig = serving_dashboard_figure(*hand_run())
    # Each value spans the time its step ran, from the previous event to its own.
    assert {t.line.shape for t in fig.data if t.line.dash == "solid"} == {"vh"}
    got = lines(fig)
    x, running = got["running"]
    assert x == [0, 0.25, 0.5, 1, 1.25, 10, 10, 10.5, 10.5, 13, 13, 13.25]
    assert running == [2, 2, 2, 2, 2, None, 1, None, 1, None, 1, 1]
    assert got["step interval"][1] == [None, 250, 250, 500, 250, None, None, None, None, None, None, 250]
    assert got["generated tokens/s"][1] == [None, 8, 8, 6, 6, None, None, None, None, None, None, 12]
    assert got["KV pool: 10 blocks"] == ([0, 13.25], [10, 10])
    assert got["max_num_seqs = 2"] == ([0, 13.25], [2, 2])


def test_title_axes_and_scrubbing() -> None:
    trace, times = hand_run()
    whole, early = serving_dashboard_figure(trace, times), serving_dashboard_figure(trace, times, step=3)
    assert whole.layout.title.text.startswith("Serving · tiny on cpu, max_num_seqs=2")
    assert ("step 8 at 13.2 s: 1 running, 0 waiting · 0 of 10 KV blocks used · interval 250.0 ms · "
            "last 1 s: 12 generated + 0 prefill tokens/s") in whole.layout.title.text
    assert "step 3 at 1.0 s: 2 running, 0 waiting · 5 of 10 KV blocks used" in early.layout.title.text
    assert lines(early)["waiting"][1] == [1, 1, 1, 0]
    assert [t.name for t in early.data] == [t.name for t in whole.data]  # so a live redraw restyles in place
    for axis in ("xaxis", "yaxis", "yaxis2", "yaxis3", "yaxis4"):
        assert early.layout[axis].range == whole.layout[axis].range
    assert whole.layout.yaxis3.range[1] == pytest.approx(500 * 1.08)
    assert whole.layout.yaxis4.range[1] == pytest.approx(12 * 1.08)
    assert whole.to_json() == serving_dashboard_figure(trace, times).to_json()
    after_idle = serving_dashboard_figure(trace, times, step=5).layout.title.text
    assert "step 5 at 10.0 s, after idle time: 1 running, 0 waiting · 0 of 10 KV blocks used" in after_idle
    empty = serving_dashboard_figure(Trace(INFO, []), [])
    assert "no steps yet" in empty.layout.title.text and not any(lines(empty)["running"][1])


def test_view_of_a_recording() -> None:
    view = ServingDashboard(hand_run())
    assert repr(view) == "ServingDashboard(steps=9, requests=5, peak_running=2, peak_waiting=1)"
    assert (view.step_slider.min, view.step_slider.max, view.step_slider.value) == (0, 8, 8)
    view.step_slider.value = 2
    assert lines(go.Figure(view.plot))["running"][1] == [2, 2, 2]
    with pytest.raises(TypeError, match=r"pass \(trace, times\)"):
        ServingDashboard(hand_run()[0])
    with pytest.raises(ValueError, match="9 events, 2 times"):
        ServingDashboard((hand_run()[0], [0.0, 1.0]))


def test_follows_an_llm_and_stops_following_when_drawing_fails(tiny_llm: LLM, monkeypatch) -> None:
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with ServingDashboard(tiny_llm, min_interval=0) as view:
        tiny_llm.generate(["def f(x):", "import os"], params, use_tqdm=False)
    # Leaving the block waits for the view's thread to record every step that reached it.
    assert not view.attached and len(view.times) == len(view.trace.events) == 4
    assert sum(generated_tokens(view.trace)) == 8 and lines(go.Figure(view.plot))["running"][1] == [2, 2, 2, 2]

    broken = ServingDashboard(tiny_llm, min_interval=0)
    monkeypatch.setattr(broken, "figure", lambda step=None: 1 / 0)
    with pytest.warns(RuntimeWarning, match="stopped following the engine: ZeroDivisionError"):
        tiny_llm.generate(["def f(x):"], params, use_tqdm=False)
        broken._follower.join(timeout=30)
    assert not broken.attached and not tiny_llm.llm_engine.step_listeners


def test_live_on_a_server_under_a_burst() -> None:
    openai = pytest.importorskip("openai")
    from minillm.entrypoints.background import BackgroundServer

    with BackgroundServer("tiny", dtype="float32", max_num_seqs=4) as server:
        view = ServingDashboard(server, min_interval=0.2)
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)

        def send(i: int) -> int:
            out = client.completions.create(model="tiny", prompt=f"def f{i}(x):", max_tokens=8, temperature=0,
                                            extra_body={"ignore_eos": True})
            return out.usage.completion_tokens

        with ThreadPoolExecutor(12) as pool:
            completion_tokens = list(pool.map(send, range(12)))
        assert view.attached
        view.detach()
    trace, times = view.trace, view.times
    events = trace.events
    assert len(times) == len(events) > 0 and times == sorted(times)
    assert len(trace.request_ids) == 12 and any(e.num_waiting > 0 for e in events)
    assert max(len(e.seqs) for e in events) <= 4
    s = serving_series(trace, times)
    assert sum(generated_tokens(trace)) == sum(completion_tokens) == 12 * 8  # no preemption: nothing lost
    assert s.busy_start[0] and all(v > 0 for v in s.interval_ms if v is not None)
    assert max(v for v in s.generated_per_s if v is not None) > 0 and max(s.blocks_used) > 0
    got = lines(view.figure())
    assert len([v for v in got["running"][1] if v is not None]) == len(events)
    assert repr(view).startswith(f"ServingDashboard(steps={len(events)}, requests=12, peak_running=")
