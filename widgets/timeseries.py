"""The base of every per-step chart: a run's numbers lined up by step, and the plotly pieces that
draw them the same way in every view (step axis, request lines, a share-of-memory axis).

A view is a function `trace -> go.Figure` built from these: pull columns out of the trace with
`per_request` / `per_step`, start from `step_figure`, add `request_line`s and `total_line`s.
Scrubbing back in time is `upto(trace, step)`; the axes stay those of the whole run, so lines grow
into a fixed frame instead of rescaling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import plotly.graph_objects as go

from minillm.engine.trace import SeqState, StepEvent, Trace

from .colors import TOTAL_COLOR, request_color

V = TypeVar("V")

HEIGHT = 460  # px; fixed so that a live redraw never makes the notebook jump
HEADROOM = 1.08  # the y axis reaches this much above the run's highest value


def upto(trace: Trace, step: int | None) -> Trace:
    """The run as it stood after `step` (the whole run for None)."""
    if step is None:
        return trace
    return Trace(trace.info, [e for e in trace.events if e.step <= step])


def steps(trace: Trace) -> list[int]:
    return [e.step for e in trace.events]


def per_request(trace: Trace, value: Callable[[SeqState], V],
                request_ids: Sequence[str] | None = None) -> dict[str, list[V | None]]:
    """`value(seq)` for every request at every step, None where the request was not in the batch
    (waiting, or already finished), which plotly draws as a gap rather than as a made-up zero.
    `request_ids` (default: the trace's) lets a view scrubbed back keep the whole run's lines."""
    ids = trace.request_ids if request_ids is None else request_ids
    columns: dict[str, list[V | None]] = {r: [None] * len(trace.events) for r in ids}
    for i, event in enumerate(trace.events):
        for seq in event.seqs:
            columns[seq.request_id][i] = value(seq)
    return columns


def per_step(trace: Trace, value: Callable[[StepEvent], V]) -> list[V]:
    return [value(e) for e in trace.events]


def step_figure(whole_run: Trace, *, title: str, subtitle: str, y_title: str, y_max: float) -> go.Figure:
    """An empty chart with the layout every per-step view shares; the axes span `whole_run`."""
    run_steps = steps(whole_run)
    first, last = (run_steps[0], run_steps[-1]) if run_steps else (0, 1)
    return go.Figure(layout=go.Layout(
        height=HEIGHT, margin=dict(l=70, r=90, t=80, b=40),
        title=dict(text=f"{title}<br><sup>{subtitle}</sup>", x=0.02, xanchor="left"),
        xaxis=dict(title=dict(text="engine step"), range=[first, max(last, first + 1)], tickformat="d"),
        yaxis=dict(title=dict(text=y_title), range=[0, y_max * HEADROOM if y_max > 0 else 1]),
        hovermode="x unified",
        # Below the plot: on the right it would collide with a share axis, and requests can be many.
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.15, yanchor="top")))


def line(x: Sequence[int], y: Sequence[float | None], *, name: str, color: str,
         text: Sequence[str | None] | None, dash: str = "solid", width: float = 2.0,
         **scatter: object) -> go.Scatter:
    """A line over steps. `text` is each point's hover text; a line without text stays out of the
    hover box, which lists every line at the hovered step and would otherwise grow long."""
    hover = dict(hoverinfo="skip") if text is None else dict(
        text=list(text), hovertemplate=f"{name}: %{{text}}<extra></extra>")
    # Plotly draws nothing for a line through a single point (the first step, say): show a dot.
    mode = "lines" if sum(v is not None for v in y) > 1 else "markers"
    return go.Scatter(x=list(x), y=list(y), name=name, mode=mode, marker=dict(color=color, size=6),
                      line=dict(color=color, dash=dash, width=width), **hover, **scatter)


def request_line(request_id: str, x: Sequence[int], y: Sequence[float | None], *,
                 text: Sequence[str | None] | None, dash: str = "solid",
                 showlegend: bool = True) -> go.Scatter:
    """One request's line, in its own colour; lines of one request share a legend entry, so a
    click on it hides all of them together."""
    return line(x, y, name=f"request {request_id}", color=request_color(request_id), text=text, dash=dash,
                width=2.0 if dash == "solid" else 1.5, legendgroup=request_id, showlegend=showlegend)


def total_line(x: Sequence[int], y: Sequence[float], *, name: str, text: Sequence[str], dash: str = "solid",
               **scatter: object) -> go.Scatter:
    return line(x, y, name=name, color=TOTAL_COLOR, text=text, dash=dash, width=3.0, **scatter)


def add_share_axis(fig: go.Figure, *, per_unit: float, title: str) -> None:
    """A second y axis, on the right, reading the left axis as a percentage of some whole
    (`per_unit` = fraction of the whole that one left-axis unit is). Its range is the left range
    scaled, so both axes describe the same lines."""
    low, high = fig.layout.yaxis.range
    fig.update_layout(yaxis2=dict(
        title=dict(text=title), overlaying="y", side="right", showgrid=False, zeroline=False,
        range=[low * per_unit * 100, high * per_unit * 100], ticksuffix="%",
        tickformat=".2~r"))  # 2 significant digits, no exponent: tiny shares read 0.00005%
    # plotly.js draws an axis only when a trace uses it; this one is invisible and silent.
    fig.add_trace(go.Scatter(x=[fig.layout.xaxis.range[0]], y=[0], yaxis="y2", mode="lines", showlegend=False,
                             hoverinfo="skip", opacity=0, name=title))
