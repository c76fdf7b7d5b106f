"""`BlockPool`: the block grid of block_pool.py, live while `generate` runs.

    view = BlockPool(llm)            # display it (last line of a cell) ...
    llm.generate(prompts, params)    # ... and blocks fill, get shared and return while this runs
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from minillm.engine.trace import Trace

from .block_pool import block_pool_figure
from .live import LiveView

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine
    from minillm.llm import LLM


class BlockPool(LiveView):
    def __init__(self, source: Trace | LLM | LLMEngine, *, min_interval: float = 0.2) -> None:
        """source: an `LLM` (or `LLMEngine`) on the paged cache to follow from now on, or a recorded `Trace`."""
        info = source.info if isinstance(source, Trace) else getattr(source, "llm_engine", source).trace_info()
        if info.kv_cache != "paged":
            raise ValueError(f"BlockPool shows the paged KV cache; this engine has kv_cache={info.kv_cache!r}")
        super().__init__(source, min_interval=min_interval)

    def figure(self, step: int | None = None) -> go.Figure:
        return block_pool_figure(self.trace, step=step)

    def __repr__(self) -> str:
        last = self.trace.events[-1] if self.trace.events else None
        free = last.num_free_blocks if last else self.trace.info.num_kv_blocks
        return f"BlockPool(blocks={self.trace.info.num_kv_blocks}, steps={len(self.trace.events)}, free={free})"
