"""`CacheGrowth`: the KV-cache chart of cache_growth.py, live while `generate` runs.

    view = CacheGrowth(llm)          # display it (last line of a cell) ...
    llm.generate(prompts, params)    # ... and it grows while this runs
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ipywidgets
import plotly.graph_objects as go

from minillm.engine.trace import Trace

from .cache_growth import UNITS, Unit, cache_growth_figure, check_unit, describe_tokens, peak_kv_tokens
from .live import LiveView

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine
    from minillm.llm import LLM


class CacheGrowth(LiveView):
    def __init__(self, source: Trace | LLM | LLMEngine, unit: Unit = "bytes", *,
                 min_interval: float = 0.2) -> None:
        """source: an `LLM` (or `LLMEngine`) to follow from now on, or a recorded `Trace`.
        unit: "bytes" or "tokens" to start with; the toggle above the chart switches it."""
        self.unit_toggle = ipywidgets.ToggleButtons(options=UNITS, value=check_unit(unit), description="unit")
        super().__init__(source, [self.unit_toggle], min_interval=min_interval)
        self.unit_toggle.observe(lambda _: self.redraw(), names="value")

    @classmethod
    def from_trace(cls, trace: Trace, unit: Unit = "bytes") -> CacheGrowth:
        return cls(trace, unit)

    @property
    def unit(self) -> Unit:
        return self.unit_toggle.value

    def figure(self, step: int | None = None) -> go.Figure:
        return cache_growth_figure(self.trace, unit=self.unit, step=step)

    def __repr__(self) -> str:
        # Also the widget's text/plain output (ipywidgets 7 and 8 both use repr): short, no traits.
        peak = describe_tokens(peak_kv_tokens(self.trace), self.unit, self.trace.info)
        trace = self.trace
        return f"CacheGrowth(steps={len(trace.events)}, requests={len(trace.request_ids)}, peak={peak})"

