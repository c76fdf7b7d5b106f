"""BatchSlots: the slots x steps chart drawn from a hand-made trace (every square where the events
put it), and live on a real engine with chunked prefill and preemption. Also run with Colab's widget
versions (tests/course/test_widgets_colab.py)."""

from __future__ import annotations

import dataclasses

import plotly.graph_objects as go

from minillm import LLM, SamplingParams
from minillm.engine.trace import SeqState, StepEvent, Trace, TraceInfo
from minillm.widgets import BatchSlots, batch_slots_figure, request_color
from minillm.widgets.batch_slots import FILL, ROW_PX

INFO = TraceInfo(model="tiny", device="cpu", dtype="float32", kv_cache="paged", kv_bytes_per_token=100,
                 device_memory_bytes=10**9, max_model_len=64, max_num_seqs=3, block_size=4, num_kv_blocks=12)


def run(request_id: str, prefill: int = 0, decode: int = 1, finish: str | None = None) -> SeqState:
    return SeqState(request_id, prefill_tokens=prefill, decode_tokens=decode, kv_tokens=0, kv_reserved_tokens=0,
                    finish_reason=finish)


def hand_trace() -> Trace:
    # 0's prompt is chunked over steps 0-1 beside 1's decodes; 0 finishes at step 2 and 2 takes its
    # slot at step 3; 1 is preempted at step 3 and comes back at step 4 in the lowest free slot.
    return Trace(INFO, [
        StepEvent(0, (run("1", decode=1), run("0", prefill=8, decode=0)), 1),
        StepEvent(1, (run("1"), run("0", prefill=5, decode=0)), 1),
        StepEvent(2, (run("1"), run("0", finish="length")), 1),
        StepEvent(3, (run("2", prefill=6, decode=0),), 1, preempted=("1",)),
        StepEvent(4, (run("2"), run("1", prefill=4, decode=3)), 0),
    ])


def cells(fig: go.Figure) -> dict[str, list[tuple]]:
    """legend name -> (step, slot, opacity or None) of each square (a bar: its slot is the middle of
    its span) or marker (the end of a finished request's step, a preemption's cross)."""
    out = {}
    for trace in fig.data:
        if trace.type == "bar":
            assert trace.width == 1 and all(h == FILL for h in trace.y)  # a whole step wide, FILL of a slot tall
            slots = [round(base + FILL / 2, 9) for base in trace.base]
            out[trace.name] = list(zip(trace.x, slots, trace.marker.opacity))
        else:
            out[trace.name] = [(x, y, None) for x, y in zip(trace.x, trace.y)]
    return out


def test_requests_keep_their_slot_and_freed_slots_are_refilled() -> None:
    fig = batch_slots_figure(hand_trace())
    got = cells(fig)
    assert got["request 1"] == [(0, 0, 1.0), (1, 0, 1.0), (2, 0, 1.0), (4, 1, 0.4)]
    assert got["request 0"] == [(0, 1, 0.4), (1, 1, 0.4), (2, 1, 1.0)]
    assert got["request 2"] == [(3, 0, 0.4), (4, 0, 1.0)]
    assert got["preempted"] == [(3, 0, None)] and got["finished"] == [(2.5, 1, None)]  # the end of step 2
    colors = {t.name: t.marker.color for t in fig.data}
    assert colors["request 2"] == request_color("2")
    hover = {t.name: t.hovertext for t in fig.data}
    assert hover["request 0"][0] == "step 0, slot 1: request 0, prefill 8 prompt tokens"
    assert "recompute 4 prompt + 3 generated tokens" in hover["request 1"][-1]
    assert "request 1 preempted" in hover["preempted"][0]
    assert "step 4: 2 running, 4 prefill + 4 decode tokens, 0 waiting · preemptions so far 1" in fig.layout.title.text


def test_scrubbing_keeps_the_frame_and_is_deterministic() -> None:
    early = batch_slots_figure(hand_trace(), step=1)
    assert set(cells(early)["request 0"]) == {(0, 1, 0.4), (1, 1, 0.4)} and "request 2" not in cells(early)
    assert early.layout.xaxis.range == batch_slots_figure(hand_trace()).layout.xaxis.range
    assert batch_slots_figure(hand_trace()).to_json() == batch_slots_figure(hand_trace()).to_json()
    assert "no steps yet" in batch_slots_figure(Trace(INFO, [])).layout.title.text


def test_live_on_a_real_engine_with_chunks_and_preemption() -> None:
    llm = LLM("tiny", max_num_seqs=4, max_model_len=96, num_kv_blocks=7, max_num_batched_tokens=24)
    prompts = [{"prompt_token_ids": list(range(5 + 11 * i, 45 + 11 * i))} for i in range(6)]
    with BatchSlots(llm, min_interval=0) as view:
        llm.generate(prompts, SamplingParams(max_tokens=30, ignore_eos=True), use_tqdm=False)
    events = view.trace.events
    assert not view.attached and len(view.trace.request_ids) == 6
    got = cells(view.figure())
    slots = {slot for name, marks in got.items() if name.startswith("request") for _, slot, _ in marks}
    assert slots <= set(range(4))
    assert got["preempted"] and len(got["finished"]) == 6
    assert any(0 < s.prefill_tokens < 40 for e in events for s in e.seqs)  # a chunk, not a whole prompt
    assert repr(view).startswith("BatchSlots(steps=")


def test_every_slot_gets_the_same_height_however_long_the_run() -> None:
    """Chapter 04's case, 8 slots over hundreds of steps, gets as many pixels per slot as a short run.
    Squares sized by the step width once drew those 8 slots in about 50 px, too flat to tell a prompt
    chunk (pale) from a decode (solid)."""
    # 80 requests in turn, 8 at a time, each a prompt step and 39 decodes.
    events = [StepEvent(i, tuple(run(str(i // 40 * 8 + r), prefill=16 * (i % 40 == 0), decode=int(i % 40 > 0),
                                     finish="length" if i % 40 == 39 else None) for r in range(8)), 0)
              for i in range(400)]
    for trace, num_slots in ((Trace(dataclasses.replace(INFO, max_num_seqs=8), events), 8), (hand_trace(), 2)):
        fig = batch_slots_figure(trace)
        assert fig.layout.yaxis.range == (num_slots - 0.5, -0.5)
        plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        assert plot_px / num_slots == ROW_PX >= 30
        assert {h * ROW_PX for t in fig.data if t.type == "bar" for h in t.y} == {FILL * ROW_PX}  # 24 px squares
