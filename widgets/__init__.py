"""Views of what the engine did, drawn from its trace events (minillm/engine/trace.py); they never
simulate the engine. One more shows a model's weights instead: `QuantError`, what weight-only
quantization (minillm/quant) does to one linear layer.

Two layers:
- pure figures, `trace -> plotly go.Figure`, deterministic and free of ipywidgets:
  `cache_growth_figure`, `block_pool_figure`, `batch_slots_figure`, `draft_acceptance_figure` (with
  `acceptance_stats`, the numbers it draws); built on timeseries.py (per-step columns, shared axes
  and lines), colors.py (one colour per request id) and formatting.py (`format_bytes`,
  `format_percent`, and `format_token`, a token's text with its whitespace shown); and
  `quant_error_figure`, `weight -> go.Figure` (quant_error.py); and `roofline_figure`, `bench
  decode`'s rows and summary -> go.Figure (roofline.py), with `roofline_points`; and
  `latency_curve_figure`, `bench serve`'s rows -> go.Figure (latency_curve.py);
- live views, ipywidgets that follow an engine while `generate` runs or show a recorded trace:
  `CacheGrowth`, `BlockPool`, `BatchSlots`, `DraftAcceptance`; built on live.py (listener, throttled
  redraw, step slider) and figure_host.py (plotly FigureWidget, or an Output fallback); and
  `QuantError`, a layer dropdown and method / group size toggles over `quant_error_figure`, and
  `Roofline`, a toggle of the series shown over `roofline_figure`, both on figure_host.py alone.

Adding a view: a pure `..._figure(trace, *, step=None)` from `upto` / `per_step` / `step_figure` /
`total_line`; then a `LiveView` subclass with its `figure(step)` calling it, as BlockPool, BatchSlots
and DraftAcceptance do, whose step slider picks the step to show.

Live views are imported lazily, so the pure layer works without ipywidgets.
"""

from .batch_slots import batch_slots_figure
from .block_pool import block_pool_figure
from .cache_growth import cache_growth_figure
from .colors import request_color
from .draft_acceptance import acceptance_stats, draft_acceptance_figure
from .formatting import format_bytes, format_percent, format_token
from .latency_curve import latency_curve_figure
from .quant_error import quant_error_figure
from .roofline import roofline_figure, roofline_points
from .serving_dashboard import serving_dashboard_figure, serving_series

__all__ = ["BatchSlots", "BlockPool", "CacheGrowth", "DraftAcceptance", "QuantError", "Roofline", "ServingDashboard",
           "acceptance_stats", "batch_slots_figure", "block_pool_figure", "cache_growth_figure",
           "draft_acceptance_figure", "format_bytes", "format_percent", "format_token", "latency_curve_figure",
           "quant_error_figure", "request_color", "roofline_figure", "roofline_points", "serving_dashboard_figure",
           "serving_series"]


def __getattr__(name: str):
    if name == "CacheGrowth":
        from .cache_growth_view import CacheGrowth

        return CacheGrowth
    if name == "BatchSlots":
        from .batch_slots_view import BatchSlots

        return BatchSlots
    if name == "BlockPool":
        from .block_pool_view import BlockPool

        return BlockPool
    if name == "DraftAcceptance":
        from .draft_acceptance_view import DraftAcceptance

        return DraftAcceptance
    if name == "ServingDashboard":
        from .serving_dashboard_view import ServingDashboard

        return ServingDashboard
    if name == "QuantError":
        from .quant_error_view import QuantError

        return QuantError
    if name == "Roofline":
        from .roofline_view import Roofline

        return Roofline
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
