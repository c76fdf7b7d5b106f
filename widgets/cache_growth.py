"""How much KV cache each request holds, step by step, and what that is of the device's memory.

Solid lines are tokens (or bytes) whose K/V are in the cache; dashed lines are what the cache has
reserved for them. A contiguous cache reserves a request's longest possible length up front, so
the shaded band between the two totals is memory held for nothing: the waste that paging removes.
"""

from __future__ import annotations

from typing import Literal, cast, get_args

import plotly.graph_objects as go

from minillm.engine.trace import Trace, TraceInfo

from .colors import RESERVED_FILL
from .formatting import format_bytes, format_percent
from .timeseries import (
    add_share_axis,
    per_request,
    per_step,
    request_line,
    step_figure,
    steps,
    total_line,
    upto,
)

Unit = Literal["bytes", "tokens"]
UNITS: tuple[Unit, ...] = get_args(Unit)


def check_unit(unit: str) -> Unit:
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    return cast(Unit, unit)


def peak_kv_tokens(trace: Trace) -> int:
    return max((e.kv_tokens for e in trace.events), default=0)


def describe_tokens(tokens: int, unit: Unit, info: TraceInfo) -> str:
    """`tokens` in `unit`, as every caption and repr of this view prints it."""
    return format_bytes(tokens * info.kv_bytes_per_token) if unit == "bytes" else f"{tokens} tokens"


def cache_growth_figure(trace: Trace, *, unit: Unit = "bytes", step: int | None = None) -> go.Figure:
    """KV cache held per request over the run (up to `step`; the whole run for None), with the
    total, the reserved amount where the cache reserves more than it uses, and a right-hand axis in
    percent of the device's memory. The same trace always gives the same figure."""
    unit = check_unit(unit)
    info = trace.info
    per_token = info.kv_bytes_per_token if unit == "bytes" else 1  # plotted value of one token
    shown = upto(trace, step)
    x = steps(shown)

    def scaled(tokens: list[int | None]) -> list[int | None]:
        return [None if t is None else t * per_token for t in tokens]

    def hover(tokens: list[int | None], what: str = "") -> list[str | None]:
        return [None if t is None else f"{t} tokens{what} = {format_bytes(t * info.kv_bytes_per_token)}"
                for t in tokens]

    # Lines are those of the whole run, not of the shown part: scrubbing never adds or drops one.
    wasteful = any(s.kv_reserved_tokens > s.kv_tokens for e in trace.events for s in e.seqs)
    fig = step_figure(
        trace, title=f"KV cache per request · {_short_model_name(info.model)} on {info.device}",
        subtitle=_caption(shown, unit), y_title=f"KV cache ({unit})",
        y_max=max((max(e.kv_tokens, e.kv_reserved_tokens) for e in trace.events), default=0) * per_token)
    if unit == "bytes":
        fig.update_yaxes(tickformat="~s", ticksuffix="B")  # SI prefixes, as format_bytes writes them
    used = per_request(shown, lambda s: s.kv_tokens, trace.request_ids)
    reserved = per_request(shown, lambda s: s.kv_reserved_tokens, trace.request_ids)
    for request_id, tokens in used.items():
        fig.add_trace(request_line(request_id, x, scaled(tokens), text=hover(tokens)))
        if wasteful:
            fig.add_trace(request_line(request_id, x, scaled(reserved[request_id]), text=None, dash="dash",
                                       showlegend=False))
    total = per_step(shown, lambda e: e.kv_tokens)
    fig.add_trace(total_line(x, scaled(total), name="total in use", text=hover(total)))
    if wasteful:
        total_reserved = per_step(shown, lambda e: e.kv_reserved_tokens)
        # fill="tonexty" shades down to the trace added just before it: the total in use.
        fig.add_trace(total_line(x, scaled(total_reserved), name="total reserved", dash="dash",
                                 text=hover(total_reserved, " reserved"), fill="tonexty",
                                 fillcolor=RESERVED_FILL))
    if info.device_memory_bytes > 0:
        bytes_per_unit = info.kv_bytes_per_token / per_token  # one unit on the left axis, in bytes
        add_share_axis(fig, per_unit=bytes_per_unit / info.device_memory_bytes,
                       title=f"% of {info.device} memory ({format_bytes(info.device_memory_bytes)})")
    return fig


def _caption(shown: Trace, unit: Unit) -> str:
    info = shown.info
    if info.kv_cache == "none":
        return "no KV cache (kv_cache='none'): every step computes every token again and keeps nothing"
    if not shown.events:
        return "no steps yet"
    last = shown.events[-1]
    used, reserved = last.kv_tokens, last.kv_reserved_tokens
    text = (f"after step {last.step}: {len(last.seqs)} running, {last.num_waiting} waiting · "
            f"{describe_tokens(used, unit, info)} in use")
    if reserved > used:
        text += f", {describe_tokens(reserved, unit, info)} reserved"
    if info.device_memory_bytes > 0:
        # What the device gives up is what is allocated: the reserved amount where it is larger.
        held = max(used, reserved) * info.kv_bytes_per_token
        text += f" = {format_percent(held / info.device_memory_bytes)} of device memory"
    return text


def _short_model_name(model: str) -> str:
    """The last part of a path or Hub id, so that the title stays on one line."""
    return model.rstrip("/").rsplit("/", 1)[-1]
