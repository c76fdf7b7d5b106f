"""`Roofline`: roofline.py's chart of `bench decode`'s measurements, with a toggle that shows all the
points or one series at a time (decode steps, prefill steps, kernels alone).

    decode_rows, prefill_rows, summary = bench_decode(path, batches=(1, 4, 16, 64), ...)
    Roofline(decode_rows, prefill_rows, summary, kernels=linear_rows(...))
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import ipywidgets
import plotly.graph_objects as go

from .figure_host import make_host
from .roofline import ALL, check_show, roofline_figure, roofline_points, series_names

if TYPE_CHECKING:
    from minillm.bench.gpu_specs import PublishedSpec


class Roofline(ipywidgets.VBox):
    def __init__(self, decode_rows: Iterable[dict], prefill_rows: Iterable[dict] = (), summary: dict | None = None,
                 *, kernels: Iterable[dict] = (), spec: PublishedSpec | None = None, show: str = ALL) -> None:
        """The three results of `bench_decode` (its rows and summary), kernels measured alone (rows
        with "label", "intensity" and "TFLOP_s"), the published roofs of this GPU if known, and the
        series shown first."""
        self.decode_rows, self.prefill_rows, self.kernels = list(decode_rows), list(prefill_rows), list(kernels)
        self.summary, self.spec = summary, spec
        points = roofline_points(self.decode_rows, self.prefill_rows, self.kernels)
        if not points:
            raise ValueError("nothing to draw: give bench_decode's decode or prefill rows, or kernel rows")
        check_show(show, points)
        roofline_figure(self.decode_rows, self.prefill_rows, summary, kernels=self.kernels)  # bad input fails here
        self.show = ipywidgets.ToggleButtons(description="show", options=[ALL, *series_names(points)], value=show)
        self._host = make_host()
        super().__init__(children=[self.show, self._host.widget])
        self.show.observe(self._on_change, names="value")
        self.redraw()

    @property
    def plot(self) -> ipywidgets.DOMWidget:
        """The widget showing the chart: a plotly FigureWidget, or an ipywidgets Output (figure_host.py)."""
        return self._host.widget

    def figure(self) -> go.Figure:
        """The chart for the current choice, as a plain plotly figure."""
        return roofline_figure(self.decode_rows, self.prefill_rows, self.summary, kernels=self.kernels,
                               show=self.show.value, spec=self.spec)

    def redraw(self) -> None:
        self._host.show(self.figure())

    def _on_change(self, change: dict) -> None:
        self.redraw()

    def __repr__(self) -> str:
        points = roofline_points(self.decode_rows, self.prefill_rows, self.kernels)
        return f"Roofline(points={len(points)}, series={series_names(points)}, show={self.show.value!r})"
