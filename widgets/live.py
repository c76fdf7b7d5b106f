"""The base of every live view: follows an engine's steps (or shows a recorded trace), redraws
at most every `min_interval` seconds while generation runs, and lets the learner scrub back
through the steps with a slider.

A view subclasses `LiveView`, passes its own controls, and implements `figure(step)` with one of
the pure `trace -> go.Figure` functions; everything else (listening, throttling, the final
redraw, the slider, the FigureWidget-or-Output choice) is here.

A view counts steps from the start of what it shows, as a fresh engine counts them (0, 1, ...):
an engine that ran before (a warm-up, an earlier run in the chapter) is hundreds of steps into its
own count, and "step 770" would tell the learner nothing about this run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from time import monotonic
from typing import TYPE_CHECKING

import ipywidgets
import plotly.graph_objects as go

from minillm.engine.trace import StepEvent, Trace

from .figure_host import make_host

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine
    from minillm.llm import LLM


class LiveView(ipywidgets.VBox):
    # A class default, since ipywidgets calls close() from __del__, also on a view whose __init__ failed.
    _engine: LLMEngine | None = None
    _first_step: int | None = None  # the engine's number for the view's step 0, once it has one

    def __init__(self, source: Trace | LLM | LLMEngine, controls: Sequence[ipywidgets.Widget] = (), *,
                 min_interval: float = 0.2) -> None:
        """source: a recorded `Trace`, or an `LLM` / `LLMEngine` to follow from now on."""
        if isinstance(source, Trace):
            self.trace = Trace(source.info, [self._renumbered(e) for e in source.events])
        else:
            engine = getattr(source, "llm_engine", source)
            if not hasattr(engine, "step_listeners"):
                raise TypeError(f"{type(self).__name__} shows a Trace, or follows an LLM or LLMEngine; "
                                f"got {type(source).__name__}")
            self.trace = Trace(engine.trace_info())
            self._engine = engine
            engine.step_listeners.append(self._on_step)
        self.min_interval = min_interval
        self._last_draw = -float("inf")  # when the last redraw ended (monotonic)
        self._draw_seconds = 0.0  # how long it took
        self._moving_slider = False
        self.step_slider = ipywidgets.IntSlider(description="step", min=0, max=0, disabled=True)
        self._host = make_host()
        super().__init__(children=[*controls, self.step_slider, self._host.widget])
        self.step_slider.observe(self._on_slider, names="value")
        self.redraw()

    def figure(self, step: int | None = None) -> go.Figure:
        """The chart after `step` (the latest step for None), as a plain plotly figure."""
        raise NotImplementedError

    @property
    def plot(self) -> ipywidgets.DOMWidget:
        """The widget showing the chart: a plotly FigureWidget, or an ipywidgets Output where a
        FigureWidget cannot be built or shown (see figure_host.py)."""
        return self._host.widget

    @property
    def attached(self) -> bool:
        return self._engine is not None and self._on_step in self._engine.step_listeners

    def redraw(self) -> None:
        """Draw what the trace holds now (call it after an interrupted `generate`, say), at the
        step the slider is on: the newest step, unless the learner has moved it back."""
        start = monotonic()
        self._sync_slider()
        shown = self.step_slider.value if self.trace.events else None
        self._host.show(self.figure(shown))
        self._last_draw = monotonic()
        self._draw_seconds = self._last_draw - start

    def detach(self) -> None:
        """Stop following the engine and draw the final state; the view keeps what it recorded."""
        self._stop_listening()
        self.redraw()

    def close(self) -> None:
        """Closing the widget also stops following the engine (no redraws of a closed widget)."""
        self._stop_listening()
        super().close()

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def _stop_listening(self) -> None:
        if self.attached:
            self._engine.step_listeners.remove(self._on_step)

    def _renumbered(self, event: StepEvent) -> StepEvent:
        if self._first_step is None:  # the first step the view shows is its step 0
            self._first_step = event.step
        return dataclasses.replace(event, step=event.step - self._first_step)

    def _on_step(self, event: StepEvent) -> None:
        self.trace(self._renumbered(event))
        # Long runs make big figures: waiting 4x the last draw keeps drawing under a fifth of the time.
        wait = max(self.min_interval, 4 * self._draw_seconds)
        # The last step of a run is always drawn, so the chart never stops short of the end.
        if event.drained or monotonic() - self._last_draw >= wait:
            self.redraw()

    def _sync_slider(self) -> None:
        """Stretch the slider over the recorded steps; a slider at the end stays at the end.

        Each assignment reaches the browser as its own message, and the browser's slider clamps a
        value outside its range and sends the clamped value back, which the kernel, busy inside
        `generate`, reads only later as if the learner had moved the slider. So the order matters:
        widen the top first, then move the value, then raise the bottom; every state the browser
        sees on the way is consistent."""
        if not self.trace.events:
            return
        s = self.step_slider
        following = s.disabled or s.value == s.max
        first, last = self.trace.events[0].step, self.trace.events[-1].step
        with self._quiet_slider():
            s.max = last
            if following:
                s.value = last
            s.min, s.disabled = first, False

    @contextlib.contextmanager
    def _quiet_slider(self) -> Iterator[None]:
        """Moves of the slider made by the view itself must not trigger another redraw."""
        self._moving_slider = True
        try:
            yield
        finally:
            self._moving_slider = False

    def _on_slider(self, change: dict) -> None:
        if not self._moving_slider:
            self.redraw()
