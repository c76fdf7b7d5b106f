"""`ServingDashboard`: the panels of serving_dashboard.py, live while a server runs.

    server = BackgroundServer("tiny", max_num_seqs=4).start()
    dashboard = ServingDashboard(server)   # display it (last line of a cell) ...
    # ... and send requests: it follows the engine step by step, whoever sends them

The engine steps in a thread of its own (AsyncLLM), and this view times it, so the listener does
no more than stamp each event's arrival and hand it over; a thread of the view records it and
redraws as LiveView does (throttled, the end of a run always). Drawn inside the listener, as the
other views are, a redraw (about 0.1 s on a CPU) would land whole in one step interval. Drawn here,
it still slows the engine a little, since both need the GIL; the step-interval panel shows that too.

Widget messages may be sent from any thread (ipykernel sends them from its IO thread); two redraws
at once, this thread's and the slider's in the kernel's main thread, must not happen, so one lock
orders recording, redrawing and the slider.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Sequence
from time import monotonic
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from minillm.engine.trace import StepEvent, Trace

from .live import LiveView
from .serving_dashboard import serving_dashboard_figure

if TYPE_CHECKING:
    from minillm.async_llm import AsyncLLM
    from minillm.engine.llm_engine import LLMEngine
    from minillm.entrypoints.background import BackgroundServer
    from minillm.llm import LLM


class ServingDashboard(LiveView):
    # A class default, since ipywidgets calls close() from __del__, also on a view whose __init__ failed.
    _follower: threading.Thread | None = None

    def __init__(self, source: BackgroundServer | AsyncLLM | LLM | LLMEngine | tuple[Trace, Sequence[float]], *,
                 min_interval: float = 0.5) -> None:
        """source: a `BackgroundServer` (or its `AsyncLLM`, an `LLM`, an `LLMEngine`) to follow from
        now on, or a recorded `(trace, times)`, times[i] the second at which event i arrived."""
        if isinstance(source, Trace):
            raise TypeError("ServingDashboard draws over time, and a Trace has no times: pass (trace, times), "
                            "times[i] the second at which event i arrived")
        times: Sequence[float] = ()
        if isinstance(source, tuple):
            source, times = source
            if len(times) != len(source.events):
                raise ValueError(f"times must have one entry per event: {len(source.events)} events, "
                                 f"{len(times)} times")
        else:
            source = getattr(source, "engine", source)  # a BackgroundServer's AsyncLLM
        self.times: list[float] = list(times)
        self._lock = threading.RLock()
        self._arrived: queue.SimpleQueue[tuple[float, StepEvent] | None] = queue.SimpleQueue()
        super().__init__(source, min_interval=min_interval)
        if self.attached:  # steps taken meanwhile wait in the queue
            self._follower = threading.Thread(target=self._follow, name="minillm-dashboard", daemon=True)
            self._follower.start()

    def figure(self, step: int | None = None) -> go.Figure:
        with self._lock:  # the trace and its times, of the same length
            return serving_dashboard_figure(self.trace, self.times, step=step)

    def redraw(self) -> None:
        with self._lock:
            super().redraw()

    def _on_step(self, event: StepEvent) -> None:
        """In the engine's thread: no more than a time stamp and a hand-over."""
        self._arrived.put((monotonic(), event))

    def _follow(self) -> None:
        try:
            while (item := self._arrived.get()) is not None:
                arrived, event = item
                with self._lock:
                    self.times.append(arrived)
                    super()._on_step(event)  # records the event; redraws when due
        except Exception as e:  # as the engine treats a listener that raises: warn, and stop following
            super()._stop_listening()
            warnings.warn(f"{self!r} stopped following the engine: {type(e).__name__}: {e}", RuntimeWarning,
                          stacklevel=1)

    def _stop_listening(self) -> None:
        """Also ends the follower, once it has recorded every step that reached the view."""
        super()._stop_listening()
        if self._follower is not None and self._follower.is_alive():
            self._arrived.put(None)
            self._follower.join()

    def _on_slider(self, change: dict) -> None:
        # Under the lock, the flag LiveView raises while it moves the slider itself is read only once
        # a redraw in the follower is over, so that a learner's move then is drawn, not dropped.
        with self._lock:
            super()._on_slider(change)

    def __repr__(self) -> str:
        events = self.trace.events
        return (f"ServingDashboard(steps={len(events)}, requests={len(self.trace.request_ids)}, "
                f"peak_running={max((len(e.seqs) for e in events), default=0)}, "
                f"peak_waiting={max((e.num_waiting for e in events), default=0)})")
