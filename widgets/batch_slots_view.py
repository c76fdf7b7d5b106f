"""`BatchSlots`: the slots x steps chart of batch_slots.py, live while `generate` runs.

    view = BatchSlots(llm)           # display it (last line of a cell) ...
    llm.generate(prompts, params)    # ... and requests fill the slots, step by step, while this runs
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from minillm.engine.trace import Trace

from .batch_slots import batch_slots_figure
from .live import LiveView

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine
    from minillm.llm import LLM


class BatchSlots(LiveView):
    def __init__(self, source: Trace | LLM | LLMEngine, *, min_interval: float = 0.2) -> None:
        """source: an `LLM` (or `LLMEngine`) to follow from now on, or a recorded `Trace`."""
        super().__init__(source, min_interval=min_interval)

    def figure(self, step: int | None = None) -> go.Figure:
        return batch_slots_figure(self.trace, step=step)

    def __repr__(self) -> str:
        events = self.trace.events
        return (f"BatchSlots(steps={len(events)}, requests={len(self.trace.request_ids)}, "
                f"preemptions={sum(len(e.preempted) for e in events)})")
