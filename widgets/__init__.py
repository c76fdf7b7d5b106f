"""Views of what the engine did, drawn from its trace events (minillm/trace.py); they never
simulate the engine. One more shows a model's weights instead: `QuantError`, what weight-only
quantization (minillm/quant) does to one linear layer.

Two layers:
- pure figures, `trace -> plotly go.Figure`, deterministic and free of ipywidgets:
  `cache_growth_figure`, `block_pool_figure`, `batch_slots_figure`; built on timeseries.py (per-step
  columns, shared axes and lines), colors.py (one colour per request id) and formatting.py
  (`format_bytes`, `format_percent`); and `quant_error_figure`, `weight -> go.Figure` (quant_error.py);
- live views, ipywidgets that follow an engine while `generate` runs or show a recorded trace:
  `CacheGrowth`, `BlockPool`, `BatchSlots`; built on live.py (listener, throttled redraw, step slider)
  and figure_host.py (plotly FigureWidget, or an Output fallback); and `QuantError`, a layer
  dropdown and method / group size toggles over `quant_error_figure`, on figure_host.py alone.

Adding a view, e.g. DraftAcceptance: a pure `draft_acceptance_figure(trace, *, step=None)` from
`per_step` / `step_figure` / `total_line`; then `class DraftAcceptance(LiveView)` with its
`figure(step)` calling it, as BlockPool and BatchSlots do with `request_color` and LiveView, whose
step slider picks the step to show.

Live views are imported lazily, so the pure layer works without ipywidgets.
"""

from .batch_slots import batch_slots_figure
from .block_pool import block_pool_figure
from .cache_growth import cache_growth_figure
from .colors import request_color
from .formatting import format_bytes, format_percent
from .quant_error import quant_error_figure

__all__ = ["BatchSlots", "BlockPool", "CacheGrowth", "QuantError", "batch_slots_figure", "block_pool_figure",
           "cache_growth_figure", "format_bytes", "format_percent", "quant_error_figure", "request_color"]


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
    if name == "QuantError":
        from .quant_error_view import QuantError

        return QuantError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
