"""Where a live view's chart lives: a plotly `FigureWidget` redrawn in place, or, where none can be
built or shown, an ipywidgets `Output` that holds the latest figure as an ordinary plotly output.

Both take a complete `go.Figure` each time, so views never depend on which one they got.
"""

from __future__ import annotations

import sys
from typing import Protocol

import ipywidgets
import plotly.graph_objects as go


class FigureHost(Protocol):
    widget: ipywidgets.DOMWidget

    def show(self, fig: go.Figure) -> None: ...


class FigureWidgetHost:
    """Updates one `FigureWidget` in place (no flicker, legend clicks survive a redraw)."""

    def __init__(self) -> None:
        self.widget = go.FigureWidget()

    def show(self, fig: go.Figure) -> None:
        w = self.widget
        if [(t.type, t.name) for t in w.data] != [(t.type, t.name) for t in fig.data]:
            # Traces came or went (a new request): replace them all.
            w.update(data=fig.data, layout=fig.layout, overwrite=True)
            return
        # Same traces: restyle them and the layout in place, sent to the browser as one message.
        layout = fig.layout.to_plotly_json()
        # The template is the same in every redraw, and comparing it costs more than drawing.
        layout.pop("template", None)
        with w.batch_update():
            for old, new in zip(w.data, fig.data, strict=True):
                old.update(new.to_plotly_json(), overwrite=True)
            w.layout.update(layout, overwrite=True)


class OutputHost:
    """Shows each figure as `display(fig)` would in this frontend (plotly picks the format: JSON
    for JupyterLab and VS Code, HTML on Colab), replacing the previous one in a single update."""

    def __init__(self) -> None:
        self.widget = ipywidgets.Output()

    def show(self, fig: go.Figure) -> None:
        # The bundle `display(fig)` would publish; IPython's display functions would publish it to
        # the cell (plotly figures display themselves), not into this widget. Assigning `outputs`
        # also works without a kernel, unlike `with output: display(fig)`.
        data = fig._repr_mimebundle_()
        self.widget.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)


def make_host() -> FigureHost:
    if not _on_colab():
        try:
            return FigureWidgetHost()
        except ImportError:  # plotly>=6 without anywidget; plotly 5 without a usable ipywidgets
            pass
    return OutputHost()


def _on_colab() -> bool:
    """Colab builds a FigureWidget but does not show one reliably: third-party widgets need its
    custom widget manager, and plotly's is reported broken even with it
    (github.com/googlecolab/colab-cdn-widget-manager/issues/51, open since 2024)."""
    return "google.colab" in sys.modules
