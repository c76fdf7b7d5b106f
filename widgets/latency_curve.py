"""The latency-throughput curve of a serving benchmark, from `bench serve`'s rows (one per request
rate): time to first token (TTFT) and time per output token (TPOT) at p50 and p95, against the
output tokens per second served, each beside the same latency of a request that had the server to
itself (a dashed line).

The two panels need different axes. TTFT past capacity grows with the queue, by orders of magnitude,
so its axis is logarithmic. TPOT stays within a few times a request alone's (at most max_num_seqs
sequences share a step), so its axis is linear from 0, where "twice the dashed line" reads as twice
the height. Every range is set from the points and the reference lines: a log axis left to plotly
would also take in an annotation's y, which plotly reads there as an exponent (10 ms -> 10^10 ms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .colors import TOTAL_COLOR
from .timeseries import HEADROOM

WIDTH = 760  # px
HEIGHT = 400
LOG_MARGIN = 1.5  # the log axis reaches this factor beyond its lowest and highest values
PERCENTILE_DASH = {50: "solid", 95: "dot"}
PANELS = (("ttft", "time to first token"), ("tpot", "time per output token"))
LINE_COLORS = {"ttft": "#636EFA", "tpot": "#EF553B"}


def latency_curve_figure(rows: Sequence[Mapping[str, float]], *, ttft_alone_ms: float,
                         tpot_alone_ms: float) -> go.Figure:
    """rows: `bench_serve`'s, each with output_throughput and {ttft,tpot}_p{50,95}_ms (a missing or
    NaN latency, where no request completed, leaves a gap); the *_alone_ms: one request's own."""
    if not rows:
        raise ValueError("rows must hold at least one benchmark row; got none")
    alone = {"ttft": ttft_alone_ms, "tpot": tpot_alone_ms}
    for name, value in alone.items():
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}_alone_ms must be a positive number of milliseconds; got {value!r}")
    throughput = [_value(row, "output_throughput") for row in rows]
    if any(x is None for x in throughput):
        raise ValueError("every row needs its output_throughput (output tokens per second served)")
    x_range = [0, max(throughput) * HEADROOM]

    fig = make_subplots(rows=1, cols=2, subplot_titles=[title for _, title in PANELS], horizontal_spacing=0.12)
    for col, (name, _) in enumerate(PANELS, start=1):
        values: list[float] = [alone[name]]
        for q, dash in PERCENTILE_DASH.items():
            y = [_value(row, f"{name}_p{q}_ms") for row in rows]
            values += [v for v in y if v is not None]
            fig.add_trace(go.Scatter(x=throughput, y=y, mode="lines+markers", name=f"{name.upper()} p{q}",
                                     line=dict(color=LINE_COLORS[name], dash=dash),
                                     hovertemplate=f"{name.upper()} p{q}: %{{y:.1f}} ms at %{{x:.0f}} tokens/s"
                                                   "<extra></extra>"), row=1, col=col)
        # A trace, not a shape: it lives in data coordinates on either axis type.
        fig.add_trace(go.Scatter(x=x_range, y=[alone[name]] * 2, mode="lines", name="a request alone",
                                 line=dict(color=TOTAL_COLOR, dash="dash", width=1.5), showlegend=col == 1,
                                 legendgroup="alone",
                                 hovertemplate=f"a request alone: {name.upper()} %{{y:.1f}} ms<extra></extra>"),
                      row=1, col=col)
        if name == "ttft":
            low, high = min(values) / LOG_MARGIN, max(values) * LOG_MARGIN
            # A log axis' range is in powers of ten.
            fig.update_yaxes(type="log", range=[math.log10(low), math.log10(high)], row=1, col=col)
        else:
            fig.update_yaxes(type="linear", range=[0, max(values) * HEADROOM], row=1, col=col)
    fig.update_xaxes(title_text="output tokens/s served", range=x_range)
    fig.update_yaxes(title_text="ms")
    fig.update_layout(width=WIDTH, height=HEIGHT, template="plotly_white", margin=dict(l=60, r=20, t=40, b=110),
                      legend=dict(orientation="h", x=0, y=-0.25, yanchor="top"))
    return fig


def _value(row: Mapping[str, float], key: str) -> float | None:
    value = row.get(key)
    return None if value is None or math.isnan(value) else value
