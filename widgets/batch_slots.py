"""The batch over time: one row per batch slot (at most max_num_seqs run at once), one column per
step, a square where a request ran in that step, coloured by request. A pale square is a prompt
chunk (prefill), a solid one a decode; a red cross marks a request preempted out of its slot, a
black bar the end of the step a request finished in. Continuous batching shows as slots refilled
the step after they free up; chunked prefill as a request's pale run spanning several steps beside
others' decodes. Each slot gets ROW_PX pixels, so the chart grows with the slots used, and the
steps share the fixed width.

A request keeps its slot from admission until it finishes or is preempted, even in a step that
ran out of token budget before reaching it.
"""

from __future__ import annotations

import plotly.graph_objects as go

from minillm.engine.trace import StepEvent, Trace

from .colors import request_color, request_order

WIDTH = 760  # px, fixed so that a live redraw never moves the page
ROW_PX = 30  # px per slot, however many slots and steps: pale and solid must be told apart
FILL = 0.8  # of a row a square fills; the gap keeps neighbouring slots apart
MARGIN = dict(l=60, r=20, t=80, b=100)  # t: the title and its caption; b: the step axis, then the legend
LEGEND_GAP_PX = 45  # below the plot, under the step axis' ticks and title
PREEMPT_COLOR = "#d62728"
FINISH_COLOR = "#222222"


def assign_slots(events: list[StepEvent]) -> list[dict[str, int]]:
    """For each step, request id -> its slot: the lowest slot free when it was admitted."""
    slots: dict[str, int] = {}
    per_step = []
    for event in events:
        for request_id in event.preempted:
            slots.pop(request_id, None)
        for seq in event.seqs:
            if seq.request_id not in slots:
                slots[seq.request_id] = min(set(range(len(slots) + 1)) - set(slots.values()))
        per_step.append(dict(slots))
        for seq in event.seqs:
            if seq.finish_reason is not None:
                del slots[seq.request_id]
    return per_step


def batch_slots_figure(trace: Trace, *, step: int | None = None) -> go.Figure:
    """Slots x steps up to `step` (the whole run for None); the axes are the whole run's."""
    events = trace.events
    slot_maps = assign_slots(events)
    previous: dict[str, int] = {}
    squares: dict[str, dict[str, list]] = {}  # request id -> columns of its squares
    crosses: dict[str, list] = {"x": [], "y": [], "text": []}
    finishes: dict[str, list] = {"x": [], "y": []}
    for event, slots in zip(events, slot_maps):
        if step is not None and event.step > step:
            break
        for request_id in event.preempted:
            if request_id in previous:
                crosses["x"].append(event.step)
                crosses["y"].append(previous[request_id])
                crosses["text"].append(f"step {event.step}: request {request_id} preempted (blocks freed; "
                                       f"it will be recomputed)")
        for seq in event.seqs:
            col = squares.setdefault(seq.request_id, {"x": [], "y": [], "opacity": [], "text": []})
            col["x"].append(event.step)
            col["y"].append(slots[seq.request_id])
            col["opacity"].append(0.4 if seq.prefill_tokens else 1.0)
            what = (f"prefill {seq.prefill_tokens} prompt tokens" if seq.prefill_tokens else "decode")
            if seq.prefill_tokens and seq.decode_tokens:
                what = f"recompute {seq.prefill_tokens} prompt + {seq.decode_tokens} generated tokens"
            elif seq.decode_tokens > 1:
                what = f"recompute {seq.decode_tokens} generated tokens"
            col["text"].append(f"step {event.step}, slot {slots[seq.request_id]}: request {seq.request_id}, {what}"
                               + (f" · finished ({seq.finish_reason})" if seq.finish_reason else ""))
            if seq.finish_reason is not None:
                finishes["x"].append(event.step)
                finishes["y"].append(slots[seq.request_id])
        previous = slots
    num_slots = max((max(s.values(), default=-1) + 1 for s in slot_maps), default=1)
    first = events[0].step if events else 0
    last = events[-1].step if events else 0
    fig = go.Figure()
    # A square is a bar one step wide and FILL of a slot tall: it scales with the axes, so a long run
    # gives narrow squares (a request's steps join into a band) but never flat ones.
    for request_id in sorted(squares, key=request_order):
        col = squares[request_id]
        fig.add_trace(go.Bar(
            x=col["x"], y=[FILL] * len(col["x"]), base=[slot - FILL / 2 for slot in col["y"]], width=1.0,
            name=f"request {request_id}", showlegend=False, hovertext=col["text"], hoverinfo="text",
            marker=dict(color=request_color(request_id), opacity=col["opacity"], line=dict(width=0))))
    row_px = ROW_PX * FILL
    fig.add_trace(go.Scatter(x=[x + 0.5 for x in finishes["x"]], y=finishes["y"], mode="markers", name="finished",
                             hoverinfo="skip",
                             marker=dict(symbol="line-ns", size=row_px, line=dict(width=3, color=FINISH_COLOR))))
    fig.add_trace(go.Scatter(x=crosses["x"], y=crosses["y"], mode="markers", name="preempted",
                             hovertext=crosses["text"], hoverinfo="text",
                             marker=dict(symbol="x", size=row_px / 2, color=PREEMPT_COLOR)))
    shown = [e for e in events if step is None or e.step <= step]
    plot_px = num_slots * ROW_PX
    fig.update_layout(
        title=dict(text=f"Batch slots · {num_slots} of max_num_seqs={trace.info.max_num_seqs} used"
                        f"<br><sup>{_caption(shown)}</sup>"),
        width=WIDTH, height=MARGIN["t"] + plot_px + MARGIN["b"], margin=MARGIN, template="plotly_white",
        barmode="overlay", hovermode="closest",
        legend=dict(orientation="h", y=-LEGEND_GAP_PX / plot_px, yanchor="top"))
    fig.update_xaxes(title="step", range=[first - 1, last + 1])
    fig.update_yaxes(title="slot", range=[num_slots - 0.5, -0.5], dtick=1)
    return fig


def _caption(events: list[StepEvent]) -> str:
    if not events:
        return "no steps yet"
    last = events[-1]
    prefill = sum(s.prefill_tokens for s in last.seqs)
    decode = sum(s.decode_tokens for s in last.seqs)
    return (f"step {last.step}: {len(last.seqs)} running, {prefill} prefill + {decode} decode tokens, "
            f"{last.num_waiting} waiting · preemptions so far {sum(len(e.preempted) for e in events)} · pale: "
            "prefill, solid: decode")

