"""`DraftAcceptance`: the draft-acceptance chart of draft_acceptance.py, live while `generate` runs.

    llm = LLM("tiny", speculative_config={"model": "tiny-draft", "num_speculative_tokens": 4})
    view = DraftAcceptance(llm)      # display it (last line of a cell) ...
    llm.generate(prompts, params)    # ... and each step's drafts show up, accepted or not, while this runs
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from minillm.engine.trace import Trace

from .draft_acceptance import acceptance_stats, draft_acceptance_figure
from .live import LiveView

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine
    from minillm.llm import LLM


class DraftAcceptance(LiveView):
    def __init__(self, source: Trace | LLM | LLMEngine, *, min_interval: float = 0.2) -> None:
        """source: an `LLM` (or `LLMEngine`) that speculates, to follow from now on, or a recorded `Trace`."""
        info = source.info if isinstance(source, Trace) else getattr(source, "llm_engine", source).trace_info()
        if info.speculative_method is None:
            raise ValueError("DraftAcceptance shows speculative decoding, and this engine does not speculate "
                             "(speculative_method=None): pass speculative_config, e.g. LLM(model, speculative_config="
                             "{'model': 'tiny-draft', 'num_speculative_tokens': 4})")
        super().__init__(source, min_interval=min_interval)

    def figure(self, step: int | None = None) -> go.Figure:
        return draft_acceptance_figure(self.trace, step=step)

    def __repr__(self) -> str:
        alpha = acceptance_stats(self.trace)["alpha"]
        return (f"DraftAcceptance(k={self.trace.info.num_speculative_tokens}, steps={len(self.trace.events)}, "
                f"alpha={'None' if alpha is None else f'{alpha:.2f}'})")
