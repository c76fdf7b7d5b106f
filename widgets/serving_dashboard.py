"""A server's engine under load, over wall-clock time: four panels sharing a time axis.

- requests: running (the sequences in the step's batch) and waiting (queued after the step), under
  the max_num_seqs line;
- KV blocks used (held by a sequence after the step: the pool minus its free blocks), under the
  pool's size;
- step interval: milliseconds between a step's event and the one before, the gap between two tokens
  of a request that runs in both (its inter-token latency);
- tokens/s over the last `window` seconds of work (see `token_rate`): tokens generated (see
  `generated_tokens`), and prompt tokens computed (prefix-cache hits cost nothing and are not
  counted; a preempted request's prompt counts again when it is recomputed).

Events carry no time: `times[i]` is when event i reached the view (ServingDashboard stamps them).
A step that left the engine empty, or a gap over `idle_gap` seconds, ends a busy period: the engine
then waited for requests, so the next gap is no step interval, and every line breaks there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.engine.trace import SeqState, Trace

from .colors import TOTAL_COLOR
from .timeseries import HEADROOM, line, per_step, upto

WINDOW = 1.0  # s of work that tokens/s averages over
IDLE_GAP = 2.0  # s: a gap this long is idle time even when the last event did not show the engine empty
WIDTH = 760  # px, fixed so that a live redraw never moves the page
PANEL = 130  # px per panel
MARGIN = dict(l=90, r=20, t=80, b=110)  # b: the time axis' title, then the legend
WAITING_COLOR = "#ff7f0e"
LIMIT_COLOR = "#999999"  # limits drawn under the lines: max_num_seqs, the KV pool
PREFILL_COLOR = "#1f77b4"
PANELS = ("requests", "KV blocks", "step interval (ms)", "tokens/s")


@dataclass(frozen=True)
class ServingSeries:
    """One value per event, in event order."""

    seconds: list[float]  # since the first event
    running: list[int]
    waiting: list[int]
    blocks_used: list[int]  # all 0 without a paged cache
    interval_ms: list[float | None]  # None for the first step of a busy period
    generated_per_s: list[float | None]  # None for the first step of a busy period
    prefill_per_s: list[float | None]
    busy_start: list[bool]  # the event starts a busy period (the engine was idle before it)


def busy_starts(trace: Trace, times: Sequence[float], idle_gap: float = IDLE_GAP) -> list[bool]:
    """True where an event starts a busy period: the first, one after a step that drained the engine,
    and one more than `idle_gap` seconds after the previous (the engine can also empty without a
    step saying so: a client that disconnects aborts its request between steps)."""
    events = trace.events
    return [i == 0 or events[i - 1].drained or times[i] - times[i - 1] > idle_gap for i in range(len(events))]


def step_intervals(times: Sequence[float], busy_start: Sequence[bool]) -> list[float | None]:
    """Milliseconds from the previous event to each event; None where a busy period starts, since
    that gap is mostly idle time."""
    return [None if start else (times[i] - times[i - 1]) * 1000 for i, start in enumerate(busy_start)]


def _decodes(seq: SeqState) -> bool:
    """A plain decode: one token fed back, plus the drafts it verifies; no prompt or recomputed tokens."""
    return seq.prefill_tokens == 0 and seq.decode_tokens == 1 + len(seq.spec_token_ids)


def generated_tokens(trace: Trace) -> list[int]:
    """Tokens generated in each step, summed over its sequences: a decode makes 1 plus the drafts
    accepted; a prompt (or recomputed) chunk makes 1 if it was the sequence's last, which the trace
    tells once the sequence finishes in that step or next decodes, and 0 until then. So a request
    counts its every output token, as the server's usage does (a stop can discard accepted drafts;
    a request preempted right after its prompt loses its first token here)."""
    counts = [0] * len(trace.events)
    decodes_next: set[str] = set()  # requests whose next step (later in the trace) is a decode
    for i in reversed(range(len(trace.events))):
        for seq in trace.events[i].seqs:
            if _decodes(seq):
                counts[i] += 1 + seq.num_accepted_tokens
                decodes_next.add(seq.request_id)
            else:
                counts[i] += seq.finish_reason is not None or seq.request_id in decodes_next
                decodes_next.discard(seq.request_id)
    return counts


def token_rate(counts: Sequence[int], times: Sequence[float], busy_start: Sequence[bool],
               window: float = WINDOW) -> list[float | None]:
    """At each event i, the counts of the steps after event k up to i, over t_i - t_k: k is the
    earliest event of the busy period at most `window` seconds before i, or the one before i if
    none is. None where a busy period starts: that step's start is unknown (the engine was idle)."""
    rates: list[float | None] = []
    first, total = 0, 0  # total: the counts of the events after `first`, up to i
    for i, t in enumerate(times):
        if busy_start[i]:
            first, total = i, 0
            rates.append(None)
            continue
        total += counts[i]
        while first < i - 1 and times[first] < t - window:
            first += 1
            total -= counts[first]
        rates.append(total / (t - times[first]) if t > times[first] else None)
    return rates


def serving_series(trace: Trace, times: Sequence[float], *, window: float = WINDOW,
                   idle_gap: float = IDLE_GAP) -> ServingSeries:
    """Every panel's numbers; times[i]: when event i arrived, in seconds (any origin)."""
    if len(times) != len(trace.events):
        raise ValueError(f"times must have one entry per event: {len(trace.events)} events, {len(times)} times")
    start = busy_starts(trace, times, idle_gap)
    pool = trace.info.num_kv_blocks
    return ServingSeries(
        seconds=[t - times[0] for t in times], running=per_step(trace, lambda e: len(e.seqs)),
        waiting=per_step(trace, lambda e: e.num_waiting),
        blocks_used=per_step(trace, lambda e: pool - e.num_free_blocks if pool else 0),
        interval_ms=step_intervals(times, start),
        generated_per_s=token_rate(generated_tokens(trace), times, start, window),
        prefill_per_s=token_rate(per_step(trace, lambda e: sum(s.prefill_tokens for s in e.seqs)), times, start,
                                 window),
        busy_start=start)


def serving_dashboard_figure(trace: Trace, times: Sequence[float], *, step: int | None = None,
                             window: float = WINDOW, idle_gap: float = IDLE_GAP) -> go.Figure:
    """The panels up to `step` (the whole run for None), in the frame of the whole run: its time
    span and its highest values, so that scrubbing never rescales. The same input, the same figure."""
    info = trace.info
    whole = serving_series(trace, times, window=window, idle_gap=idle_gap)
    shown_trace = upto(trace, step)
    s = serving_series(shown_trace, times[:len(shown_trace.events)], window=window, idle_gap=idle_gap)
    steps = per_step(shown_trace, lambda e: e.step)
    fig = make_subplots(rows=len(PANELS), cols=1, shared_xaxes=True, vertical_spacing=0.04)
    end = max(whole.seconds[-1] if whole.seconds else 0, 1)

    def add(row: int, y: Sequence[float | None], name: str, color: str, fmt: str = "d", unit: str = "") -> None:
        x, y, text = _broken(s.seconds, y, [None if v is None else f"{v:{fmt}}{unit} (step {n})"
                                            for v, n in zip(y, steps)], s.busy_start)
        # "vh": a step's value spans the time from the previous event to its own, while the step ran.
        fig.add_trace(line(x, y, name=name, color=color, text=text, width=2.5, line_shape="vh"), row=row, col=1)

    def limit(row: int, value: float, name: str) -> None:
        fig.add_trace(line([0, end], [value, value], name=name, color=LIMIT_COLOR, text=None, dash="dash",
                           width=1.5), row=row, col=1)

    limit(1, info.max_num_seqs, f"max_num_seqs = {info.max_num_seqs}")
    add(1, s.running, "running", TOTAL_COLOR)
    add(1, s.waiting, "waiting", WAITING_COLOR)
    limit(2, info.num_kv_blocks, f"KV pool: {info.num_kv_blocks} blocks")
    add(2, s.blocks_used, "KV blocks used", TOTAL_COLOR, unit=f" of {info.num_kv_blocks}")
    add(3, s.interval_ms, "step interval", TOTAL_COLOR, ".1f", " ms")
    add(4, s.generated_per_s, "generated tokens/s", TOTAL_COLOR, ".0f")
    add(4, s.prefill_per_s, "prefill tokens/s", PREFILL_COLOR, ".0f")

    highest = (max([info.max_num_seqs, *whole.running, *whole.waiting]), info.num_kv_blocks,
               max([v for v in whole.interval_ms if v is not None], default=0),
               max([v for v in whole.generated_per_s + whole.prefill_per_s if v is not None], default=0))
    for row, (title, top) in enumerate(zip(PANELS, highest), start=1):
        fig.update_yaxes(title=dict(text=title), range=[0, top * HEADROOM if top > 0 else 1], row=row, col=1)
    fig.update_xaxes(range=[0, end])
    fig.update_xaxes(title=dict(text="seconds since the first step"), row=len(PANELS), col=1)
    plot = len(PANELS) * PANEL
    paged = "" if info.num_kv_blocks else " · not a paged cache: no KV blocks"
    fig.update_layout(
        title=dict(text=f"Serving · {info.model} on {info.device}, max_num_seqs={info.max_num_seqs}{paged}"
                        f"<br><sup>{_caption(shown_trace, s, window)}</sup>", x=0.02, xanchor="left"),
        width=WIDTH, height=MARGIN["t"] + plot + MARGIN["b"], margin=MARGIN, template="plotly_white",
        hovermode="x unified", legend=dict(orientation="h", x=0, y=-55 / plot, yanchor="top"))
    return fig


def _broken(x: Sequence[float], y: Sequence[float | None], text: Sequence[str | None],
            busy_start: Sequence[bool]) -> tuple[list, list, list]:
    """The points with a gap (a None) before each busy period but the first: no line across idle time."""
    out_x, out_y, out_text = [], [], []
    for i, start in enumerate(busy_start):
        if start and i:
            out_x.append(x[i])
            out_y.append(None)
            out_text.append(None)
        out_x.append(x[i])
        out_y.append(y[i])
        out_text.append(text[i])
    return out_x, out_y, out_text


def _caption(shown: Trace, s: ServingSeries, window: float) -> str:
    if not shown.events:
        return "no steps yet: send the server some requests"
    event, interval = shown.events[-1], s.interval_ms[-1]
    blocks = f" · {s.blocks_used[-1]} of {shown.info.num_kv_blocks} KV blocks used" if shown.info.num_kv_blocks else ""
    if interval is None:  # the first step after idle time: neither its duration nor a rate is known
        return (f"step {event.step} at {s.seconds[-1]:.1f} s, after idle time: {s.running[-1]} running, "
                f"{s.waiting[-1]} waiting{blocks}")
    generated, prefill = (_number(v) for v in (s.generated_per_s[-1], s.prefill_per_s[-1]))
    return (f"step {event.step} at {s.seconds[-1]:.1f} s: {s.running[-1]} running, {s.waiting[-1]} waiting{blocks} · "
            f"interval {interval:.1f} ms · last {window:g} s: {generated} generated + {prefill} prefill tokens/s")


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"
