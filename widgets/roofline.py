"""The roofline of a machine, with the engine's measured steps on it: `bench decode`'s rows drawn at
(arithmetic intensity, achieved FLOP/s) on log-log axes, under the roofs measured in the same run.

A point's x is its flops per byte moved; its y the flops it did per second. The measured roofs are
the copy bandwidth (a line of slope 1: at intensity I a step moving bytes at full bandwidth does
I × bandwidth flop/s) and the matmul peak (flat); they meet at the ridge point. Below the ridge a
step can at best ride the sloped roof (bound by memory), above it the flat one (bound by compute);
the vertical gap between a point and the roof above it is what the step leaves on the table.

Series: decode steps by batch size (one series per mode, eager and CUDA graphs, when both were
run), prefill steps by prompt length, and kernels measured alone if given (rows with "label",
"intensity" and "TFLOP_s", such as `bench.decode.linear_rows`). Optionally, the spec sheet's roofs
(`bench.gpu_specs.published_spec`) dashed beside the measured ones.

Nothing here measures: everything drawn comes from the rows and the summary given.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from .formatting import format_percent

if TYPE_CHECKING:
    from minillm.bench.gpu_specs import PublishedSpec

WIDTH = 760  # px, as the other views
HEIGHT = 560
ALL = "all"
ROOF_COLOR = "#444444"
SPEC_COLOR = "#9aa5b1"
SERIES_COLORS = {"decode": "#1f77b4", "decode, eager": "#1f77b4", "decode, graphs": "#2ca02c", "prefill": "#d62728",
                 "prefill, eager": "#d62728", "prefill, graphs": "#ff7f0e", "kernels": "#9467bd"}
SERIES_SYMBOLS = {"decode": "circle", "decode, eager": "circle", "decode, graphs": "diamond", "prefill": "square",
                  "prefill, eager": "square", "prefill, graphs": "triangle-up", "kernels": "x"}


@dataclass(frozen=True)
class Roofs:
    """The two measured roofs: bytes per second a copy moves, flops per second a matmul does."""

    bandwidth: float  # bytes/s
    peak: float  # flop/s

    @property
    def ridge(self) -> float:
        """The intensity (flop/byte) where the roofs meet."""
        return self.peak / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The most flop/s a step of this intensity can do: min(peak, intensity × bandwidth)."""
        return min(self.peak, intensity * self.bandwidth)


@dataclass(frozen=True)
class RooflinePoint:
    series: str
    label: str  # short, drawn beside the marker: "8" (batch), "256" (tokens), a kernel's name
    intensity: float  # flop/byte
    flops: float  # achieved flop/s
    detail: str  # the rest of the row, for the hover

    def of_roof(self, roofs: Roofs) -> float:
        """Achieved over attainable at this intensity."""
        return self.flops / roofs.attainable(self.intensity)


def roofs_from_summary(summary: dict) -> Roofs:
    """The roofs of `bench_decode`'s summary (copy_GB_s, matmul_TFLOP_s)."""
    return Roofs(bandwidth=summary["copy_GB_s"] * 1e9, peak=summary["matmul_TFLOP_s"] * 1e12)


def roofline_points(decode_rows: Iterable[dict] = (), prefill_rows: Iterable[dict] = (),
                    kernels: Iterable[dict] = ()) -> list[RooflinePoint]:
    """One point per row of `bench_decode` (decode, then prefill) and per kernel row."""
    decode_rows, prefill_rows, kernels = list(decode_rows), list(prefill_rows), list(kernels)
    modes = list(dict.fromkeys(r.get("mode", "eager") for r in decode_rows))
    points = []
    for r in decode_rows:
        series = f"decode, {r.get('mode', 'eager')}" if len(modes) > 1 else "decode"
        detail = (f"{r['step_ms']:.3g} ms per step, {r['tokens_per_s']:,.0f} tokens/s<br>"
                  f"{r['GB_s']:.3g} GB/s moved = {format_percent(r['of_copy_bw'])} of the copy bandwidth")
        points.append(RooflinePoint(series, str(r["batch"]), r["intensity"], r["TFLOP_s"] * 1e12,
                                    f"decode step, batch {r['batch']} ({r.get('mode', 'eager')})<br>{detail}"))
    prefill_modes = list(dict.fromkeys(r.get("mode", "eager") for r in prefill_rows))
    for r in prefill_rows:
        series = f"prefill, {r.get('mode', 'eager')}" if len(prefill_modes) > 1 else "prefill"
        detail = f"{r['ms']:.3g} ms = time to first token, {r['GB_s']:.3g} GB/s moved"
        points.append(RooflinePoint(series, str(r["tokens"]), r["intensity"], r["TFLOP_s"] * 1e12,
                                    f"prefill of {r['tokens']} tokens ({r.get('mode', 'eager')})<br>{detail}"))
    for r in kernels:
        extra = f"<br>{r['us']:.3g} µs per call" if "us" in r else ""
        points.append(RooflinePoint("kernels", r.get("short", r["label"]), r["intensity"], r["TFLOP_s"] * 1e12,
                                    f"kernel alone: {r['label']}{extra}"))
    return points


def series_names(points: Sequence[RooflinePoint]) -> list[str]:
    return list(dict.fromkeys(p.series for p in points))


def check_show(show: str, points: Sequence[RooflinePoint]) -> None:
    names = series_names(points)
    if show != ALL and show not in names:
        raise ValueError(f"show must be {ALL!r} or one of the series {names}, got {show!r}")


def roofline_figure(decode_rows: Iterable[dict] = (), prefill_rows: Iterable[dict] = (), summary: dict | None = None,
                    *, kernels: Iterable[dict] = (), show: str = ALL, spec: PublishedSpec | None = None) -> go.Figure:
    """The roofs of `summary` and the points of the rows; `show`: "all" or one series name
    ("decode" or "decode, eager" / "decode, graphs", "prefill" or "prefill, eager" / "prefill, graphs",
    "kernels")."""
    if summary is None:
        raise ValueError("summary is required: the roofs come from bench_decode's summary (copy_GB_s, matmul_TFLOP_s)")
    roofs = roofs_from_summary(summary)
    points = roofline_points(decode_rows, prefill_rows, kernels)
    check_show(show, points)
    shown = [p for p in points if show in (ALL, p.series)]
    # The frame covers every point, shown or not, and the ridge, so that switching series never rescales.
    xs = [p.intensity for p in points] + [roofs.ridge] + ([spec.ridge] if spec else [])
    lo, hi = min(xs) / 4, max(xs) * 4
    ys = [p.flops for p in points] + [roofs.attainable(lo), roofs.peak] + ([spec.tflops * 1e12] if spec else [])
    y_lo, y_hi = min(ys) / 4, max(ys) * 3

    fig = go.Figure()
    _add_roof(fig, roofs, lo, hi, "measured roof", ROOF_COLOR, "solid",
              f"copy {roofs.bandwidth / 1e9:.3g} GB/s, matmul {roofs.peak / 1e12:.3g} TFLOP/s (measured)")
    if spec is not None:
        published = Roofs(spec.tb_s * 1e12, spec.tflops * 1e12)
        _add_roof(fig, published, lo, hi, f"published roof ({spec.name})", SPEC_COLOR, "dash",
                  f"{spec.name} spec sheet: {spec.tb_s:g} TB/s, {spec.tflops:g} TFLOP/s {spec.precision}")
    fig.add_trace(go.Scatter(x=[roofs.ridge, roofs.ridge], y=[y_lo, roofs.peak], mode="lines", name="ridge point",
                             line=dict(color=ROOF_COLOR, width=1, dash="dot"), hoverinfo="text",
                             hovertext=[f"ridge point: {roofs.ridge:.3g} flop/byte"] * 2))
    for name in series_names(shown):
        members = [p for p in shown if p.series == name]
        fig.add_trace(go.Scatter(
            x=[p.intensity for p in members], y=[p.flops for p in members], mode="markers+text", name=name,
            text=[p.label for p in members], textposition="top center", textfont=dict(size=10),
            marker=dict(color=SERIES_COLORS.get(name, "#7f7f7f"), symbol=SERIES_SYMBOLS.get(name, "circle"), size=9),
            hoverinfo="text", hovertext=[_hover(p, roofs) for p in members]))
    fig.update_xaxes(type="log", range=[math.log10(lo), math.log10(hi)],
                     title_text="arithmetic intensity (flop per byte moved)")
    fig.update_yaxes(type="log", range=[math.log10(y_lo), math.log10(y_hi)], exponentformat="SI",
                     title_text="achieved FLOP/s")
    fig.update_layout(title=dict(text=_title(summary, roofs, show, shown)), width=WIDTH, height=HEIGHT,
                      template="plotly_white", margin=dict(l=80, r=30, t=90, b=60),
                      legend=dict(x=0.01, y=0.99, bgcolor="rgba(255,255,255,0.8)"))
    return fig


def _add_roof(fig: go.Figure, roofs: Roofs, lo: float, hi: float, name: str, color: str, dash: str,
              text: str) -> None:
    x = [lo, roofs.ridge, hi] if lo < roofs.ridge < hi else [lo, hi]
    fig.add_trace(go.Scatter(x=x, y=[roofs.attainable(v) for v in x], mode="lines", name=name,
                             line=dict(color=color, width=2, dash=dash), hoverinfo="text",
                             hovertext=[text] * len(x)))


def _hover(p: RooflinePoint, roofs: Roofs) -> str:
    bound = "memory" if p.intensity < roofs.ridge else "compute"
    return (f"{p.detail}<br>{p.intensity:.3g} flop/byte, {p.flops / 1e9:.3g} GFLOP/s achieved<br>"
            f"{format_percent(p.of_roof(roofs))} of the roof here "
            f"({roofs.attainable(p.intensity) / 1e9:.3g} GFLOP/s attainable, bound by {bound})")


def _title(summary: dict, roofs: Roofs, show: str, shown: list[RooflinePoint]) -> str:
    head = (f"Roofline · {summary.get('device', '?')}, {str(summary.get('dtype', '?')).removeprefix('torch.')}: "
            f"copy {roofs.bandwidth / 1e9:.3g} GB/s, matmul {roofs.peak / 1e12:.3g} TFLOP/s, "
            f"ridge {roofs.ridge:.3g} flop/byte")
    if not shown:
        return f"{head}<br><sup>showing {show}: no points</sup>"
    best = max(shown, key=lambda p: p.of_roof(roofs))
    return (f"{head}<br><sup>showing {show}: {len(shown)} points; closest to its roof: "
            f"{best.series} {best.label} at {format_percent(best.of_roof(roofs))}</sup>")
