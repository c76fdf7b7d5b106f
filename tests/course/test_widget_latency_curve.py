"""The latency-throughput curve of chapter 07, drawn from hand-made benchmark rows: its axes, its
lines and its reference lines. Also run with Colab's widget versions (tests/course/test_widgets_colab.py)."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest

from minillm.widgets import latency_curve_figure

# Four rates and the saturated run, as chapter 07's sweep gives them on a CPU: TTFT climbs by orders
# of magnitude past capacity, TPOT a few times over.
KEYS = ("output_throughput", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms")
ROWS = [dict(zip(KEYS, values)) for values in [(60.0, 40.0, 70.0, 12.0, 15.0), (110.0, 55.0, 120.0, 16.0, 22.0),
                                               (180.0, 90.0, 400.0, 25.0, 34.0), (210.0, 900.0, 2500.0, 31.0, 40.0),
                                               (220.0, 1500.0, 3100.0, 33.0, 41.0)]]
ALONE = {"ttft_alone_ms": 30.0, "tpot_alone_ms": 10.0}


def panel(fig: go.Figure, name: str) -> dict[str, go.Scatter]:
    """The lines of one panel ("ttft" on the left, "tpot" on the right) by legend name."""
    yaxis = "y" if name == "ttft" else "y2"
    return {t.name: t for t in fig.data if t.yaxis == yaxis}


def test_tpot_is_linear_from_zero_and_frames_the_lines() -> None:
    """The chart once put TPOT on a log axis with a reference line whose label plotly read there as a
    power of ten, so the axis ran to 10^10 ms and every curve lay flat at its bottom."""
    fig = latency_curve_figure(ROWS, **ALONE)
    axis = fig.layout.yaxis2
    assert axis.type == "linear" and axis.range[0] == 0
    highest = max(row[k] for row in ROWS for k in ("tpot_p50_ms", "tpot_p95_ms"))
    assert highest < axis.range[1] <= 1.1 * highest
    assert not fig.layout.shapes and all(a.yref == "paper" for a in fig.layout.annotations)  # subplot titles only


def test_ttft_is_logarithmic_around_its_points() -> None:
    axis = latency_curve_figure(ROWS, **ALONE).layout.yaxis
    assert axis.type == "log"
    low, high = (10 ** v for v in axis.range)  # a log axis' range is in powers of ten
    lowest = min(ALONE["ttft_alone_ms"], *(row["ttft_p50_ms"] for row in ROWS))
    highest = max(row["ttft_p95_ms"] for row in ROWS)
    assert lowest / 2 <= low < lowest and highest < high <= 2 * highest


def test_lines_are_the_rows_and_a_request_alone() -> None:
    fig = latency_curve_figure(ROWS, **ALONE)
    x_range = list(fig.layout.xaxis.range)
    for name in ("ttft", "tpot"):
        lines = panel(fig, name)
        assert set(lines) == {f"{name.upper()} p50", f"{name.upper()} p95", "a request alone"}
        for q, dash in ((50, "solid"), (95, "dot")):
            line = lines[f"{name.upper()} p{q}"]
            assert list(line.x) == [row["output_throughput"] for row in ROWS]
            assert list(line.y) == [row[f"{name}_p{q}_ms"] for row in ROWS] and line.line.dash == dash
        alone = lines["a request alone"]
        assert list(alone.y) == [ALONE[f"{name}_alone_ms"]] * 2 and list(alone.x) == x_range
    assert x_range[0] == 0 and x_range[1] > max(row["output_throughput"] for row in ROWS)
    assert latency_curve_figure(ROWS, **ALONE).to_json() == fig.to_json()


def test_a_missing_latency_leaves_a_gap() -> None:
    rows = [dict(ROWS[0]), {"output_throughput": 0.0}, {**ROWS[1], "tpot_p95_ms": math.nan}]
    fig = latency_curve_figure(rows, **ALONE)
    assert list(panel(fig, "tpot")["TPOT p95"].y) == [15.0, None, None]
    assert list(panel(fig, "ttft")["TTFT p50"].y) == [40.0, None, 55.0]


@pytest.mark.parametrize("rows, alone, message", [
    ([], ALONE, "rows must hold at least one"),
    (ROWS, {**ALONE, "tpot_alone_ms": 0.0}, "tpot_alone_ms must be a positive"),
    (ROWS, {**ALONE, "ttft_alone_ms": math.inf}, "ttft_alone_ms must be a positive"),
    ([{"ttft_p50_ms": 1.0}], ALONE, "output_throughput"),
])
def test_bad_input(rows: list[dict], alone: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        latency_curve_figure(rows, **alone)
