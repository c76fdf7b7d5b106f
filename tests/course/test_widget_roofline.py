"""Roofline: the roofs and points drawn from a hand-made `bench decode` table (every number where
the roofline model puts it), the published roofs beside the measured ones, and the view's series
toggle. Also run with Colab's widget versions (tests/course/test_widgets_colab.py)."""

from __future__ import annotations

import math
import subprocess
import sys

import ipywidgets
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from minillm.bench.gpu_specs import published_spec
from minillm.widgets import Roofline, roofline_figure, roofline_points
from minillm.widgets.roofline import Roofs, roofs_from_summary

# A machine with a 100 GB/s copy and a 2 TFLOP/s matmul: its ridge is at 20 flop/byte.
SUMMARY = {"device": "test device", "dtype": "torch.float16", "copy_GB_s": 100.0, "matmul_TFLOP_s": 2.0}


def decode_row(mode: str, batch: int, intensity: float, tflops: float) -> dict:
    return {"mode": mode, "batch": batch, "step_ms": 1.0, "tokens_per_s": batch * 1e3, "GB_per_step": 0.1,
            "GB_s": tflops * 1e3 / intensity, "of_copy_bw": tflops * 1e3 / intensity / 100, "TFLOP_s": tflops,
            "intensity": intensity, "bound": "memory" if intensity < 20 else "compute"}


DECODE = [decode_row("eager", 1, 1.0, 0.05), decode_row("eager", 8, 8.0, 0.4), decode_row("eager", 64, 60.0, 1.0)]
PREFILL = [{"tokens": 256, "ms": 5.0, "GB_per_step": 0.1, "GB_s": 20.0, "of_copy_bw": 0.2, "TFLOP_s": 1.5,
            "intensity": 200.0, "bound": "compute", "of_peak": 0.75}]
KERNELS = [{"label": "linear 64×64, batch 1", "short": "linear 1", "us": 2.0, "intensity": 0.5, "TFLOP_s": 0.02}]


def trace(fig: go.Figure, name: str) -> go.BaseTraceType:
    (found,) = [t for t in fig.data if t.name == name]
    return found


def point_names(fig: go.Figure) -> list[str]:
    return [t.name for t in fig.data if t.mode == "markers+text"]


# ---- the pure figure ----

def test_roofs_and_ridge_come_from_the_summary() -> None:
    roofs = roofs_from_summary(SUMMARY)
    assert roofs == Roofs(bandwidth=100e9, peak=2e12)
    assert roofs.ridge == pytest.approx(20.0)
    assert roofs.attainable(1.0) == pytest.approx(100e9)  # below the ridge: intensity × bandwidth
    assert roofs.attainable(1000.0) == pytest.approx(2e12)  # above it: the peak


def test_points_sit_at_intensity_and_achieved_flops() -> None:
    points = roofline_points(DECODE, PREFILL, KERNELS)
    assert [(p.series, p.label) for p in points] == [("decode", "1"), ("decode", "8"), ("decode", "64"),
                                                     ("prefill", "256"), ("kernels", "linear 1")]
    assert [p.intensity for p in points] == [1.0, 8.0, 60.0, 200.0, 0.5]
    assert [p.flops for p in points] == pytest.approx([0.05e12, 0.4e12, 1e12, 1.5e12, 0.02e12])
    roofs = roofs_from_summary(SUMMARY)
    # batch 1: 0.05 TFLOP/s at 1 flop/byte, where the roof is 100 GFLOP/s: half of it.
    assert points[0].of_roof(roofs) == pytest.approx(0.5)
    assert points[3].of_roof(roofs) == pytest.approx(0.75)  # prefill: 1.5 of the 2 TFLOP/s peak


def test_figure_draws_the_measured_roof_the_ridge_and_every_point() -> None:
    fig = roofline_figure(DECODE, PREFILL, SUMMARY, kernels=KERNELS)
    roof = trace(fig, "measured roof")
    assert list(roof.x)[1] == pytest.approx(20.0)  # the bend is the ridge
    for x, y in zip(roof.x, roof.y):
        assert y == pytest.approx(min(2e12, 100e9 * x))
    ridge = trace(fig, "ridge point")
    assert list(ridge.x) == pytest.approx([20.0, 20.0]) and ridge.y[1] == pytest.approx(2e12)
    assert point_names(fig) == ["decode", "prefill", "kernels"]
    decode = trace(fig, "decode")
    assert list(decode.x) == [1.0, 8.0, 60.0] and list(decode.text) == ["1", "8", "64"]
    assert "50% of the roof here" in decode.hovertext[0] and "bound by memory" in decode.hovertext[0]
    assert "bound by compute" in decode.hovertext[2]
    assert "prefill of 256 tokens" in trace(fig, "prefill").hovertext[0]
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    # The frame holds every point and both roofs, whatever is shown.
    lo, hi = (10 ** v for v in fig.layout.xaxis.range)
    assert lo < 0.5 and hi > 200
    title = fig.layout.title.text
    assert title.startswith("Roofline · test device, float16: copy 100 GB/s, matmul 2 TFLOP/s, ridge 20 flop/byte")
    assert "showing all: 5 points; closest to its roof: prefill 256 at 75%" in title


def test_showing_one_series_keeps_the_frame() -> None:
    full = roofline_figure(DECODE, PREFILL, SUMMARY, kernels=KERNELS)
    only = roofline_figure(DECODE, PREFILL, SUMMARY, kernels=KERNELS, show="prefill")
    assert point_names(only) == ["prefill"]
    assert "showing prefill: 1 points" in only.layout.title.text
    assert only.layout.xaxis.range == full.layout.xaxis.range and only.layout.yaxis.range == full.layout.yaxis.range
    with pytest.raises(ValueError, match="show must be 'all' or one of the series"):
        roofline_figure(DECODE, PREFILL, SUMMARY, show="graphs")


def test_eager_and_graphs_are_two_series() -> None:
    rows = DECODE + [decode_row("graphs", 1, 1.0, 0.09)]
    assert point_names(roofline_figure(rows, (), SUMMARY)) == ["decode, eager", "decode, graphs"]
    assert "(graphs)" in trace(roofline_figure(rows, (), SUMMARY), "decode, graphs").hovertext[0]


def test_published_roof_is_drawn_beside_the_measured_one() -> None:
    spec = published_spec("NVIDIA H100 80GB HBM3")
    fig = roofline_figure(DECODE, PREFILL, SUMMARY, spec=spec)
    published = trace(fig, "published roof (H100 SXM)")
    assert published.line.dash == "dash"
    assert max(published.y) == pytest.approx(989e12)
    assert published.x[1] == pytest.approx(989 / 3.35)  # its own ridge, near 300 flop/byte
    assert 10 ** fig.layout.yaxis.range[1] > 989e12


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="summary is required"):
        roofline_figure(DECODE, PREFILL)
    with pytest.raises(ValueError, match="nothing to draw"):
        Roofline([], [], SUMMARY)


def test_figure_is_deterministic_and_pure() -> None:
    assert roofline_figure(DECODE, PREFILL, SUMMARY).to_json() == roofline_figure(DECODE, PREFILL, SUMMARY).to_json()
    code = ("import sys; from minillm.widgets import roofline_figure; "
            f"roofline_figure({DECODE!r}, {PREFILL!r}, {SUMMARY!r}); "
            "assert 'ipywidgets' not in sys.modules, 'the pure layer imported ipywidgets'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_published_specs() -> None:
    for name, expected in (("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                           ("NVIDIA H200", "H200 SXM"), ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
                           ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("Tesla T4", "T4"), ("NVIDIA L4", "L4"),
                           ("NVIDIA GeForce RTX 4090", "RTX 4090")):
        assert published_spec(name).name == expected, name
    for name in ("cpu", "NVIDIA L40S", "NVIDIA GeForce RTX 3090", "NVIDIA A100-SXM4-40GB"):
        assert published_spec(name) is None, name
    assert published_spec("Tesla T4").ridge == pytest.approx(65 / 0.32)
    assert math.isclose(published_spec("NVIDIA H100 80GB HBM3").ridge, 295.2, rel_tol=1e-3)


# ---- the view ----

def shown(view: Roofline) -> go.Figure:
    """The figure the view shows right now, whichever widget holds it."""
    if isinstance(view.plot, ipywidgets.Output):
        (output,) = view.plot.outputs
        return go.Figure(output["data"]["application/vnd.plotly.v1+json"])
    return go.Figure(view.plot)


def test_view_toggles_the_series() -> None:
    view = Roofline(DECODE, PREFILL, SUMMARY, kernels=KERNELS)
    assert isinstance(view, ipywidgets.VBox) and view.plot in view.children
    assert list(view.show.options) == ["all", "decode", "prefill", "kernels"] and view.show.value == "all"
    assert point_names(shown(view)) == ["decode", "prefill", "kernels"]
    view.show.value = "decode"
    assert point_names(shown(view)) == ["decode"]
    assert "showing decode: 3 points" in shown(view).layout.title.text
    assert repr(view) == "Roofline(points=5, series=['decode', 'prefill', 'kernels'], show='decode')"
    view.show.value = "kernels"
    assert point_names(shown(view)) == ["kernels"]
    view.show.value = "all"
    again = shown(view)
    assert point_names(again) == ["decode", "prefill", "kernels"]
    assert again.layout.title.text == roofline_figure(DECODE, PREFILL, SUMMARY, kernels=KERNELS).layout.title.text


def test_view_takes_bench_decode_results_and_a_spec() -> None:
    view = Roofline(*(DECODE, PREFILL, SUMMARY), spec=published_spec("Tesla T4"), show="prefill")
    assert "published roof (T4)" in [t.name for t in shown(view).data]
    assert point_names(shown(view)) == ["prefill"]
    with pytest.raises(ValueError, match="show must be"):
        Roofline(DECODE, PREFILL, SUMMARY, show="kernels")


def test_view_on_colab_uses_an_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.colab", sys.modules[__name__])  # any module will do
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")  # as JupyterLab's (Colab's is HTML)
    view = Roofline(DECODE, PREFILL, SUMMARY)
    assert isinstance(view.plot, ipywidgets.Output)
    view.show.value = "prefill"
    assert len(view.plot.outputs) == 1 and point_names(shown(view)) == ["prefill"]
