"""Speculative decoding, step by step: what the proposer guessed, what the target kept, and what that
buys. Needs a trace of an engine that speculates (`speculative_config`).

Top: a band per request that speculated, a column per step; down the column, the step's k draft
tokens in order, green where the target accepted it, red the first it rejected, grey the ones after
that (never judged: they continued a wrong guess). A black dot is the target's own token after the
accepted prefix: on the red square, the token it recovered there; below a proposal accepted whole,
the bonus token.

Bottom: tokens per target call so far (each verify yields its accepted drafts plus the target's
token) against what Leviathan et al.'s formula predicts from the acceptance rate measured so far.
Only verifies count: a sequence's step without a proposal (the ngram proposer found no match) is a
plain decode, one token per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minillm.engine.trace import SeqState, Trace
from minillm.spec_decode.acceptance import AcceptanceCounts, AcceptanceStats, proposals
from minillm.spec_decode.acceptance import acceptance_stats as trace_acceptance_stats

from .colors import TOTAL_COLOR, request_color
from .timeseries import HEADROOM, line, steps, total_line, upto

WIDTH = 760  # px, with the height fixed by the run's shape, so that a live redraw never moves the page
ACCEPTED_COLOR = "#2ca02c"
REJECTED_COLOR = "#d62728"
UNJUDGED_COLOR = "#c7c7c7"
FORMULA_COLOR = "#1f77b4"
FORMULA_NAME = "expected: (1 − α^(k+1)) / (1 − α)"
LINE_PANEL = 200  # px: the tokens-per-call panel
GAP = 40  # px between the panels
MARGIN = dict(l=90, r=20, t=90, b=110)  # b: the axis title, then a legend of two rows
LEGEND_BELOW = 55  # px from the bottom of the plot to the legend's top, clear of the axis title
OUTCOMES = {"accepted": "accepted",
            "rejected": "rejected: the target disagrees, and puts its own token here",
            "not judged": "not judged: it follows a rejected token, so it is discarded unchecked"}


def acceptance_stats(trace: Trace, step: int | None = None) -> AcceptanceStats:
    """The run's acceptance numbers after `step` (the whole run for None); see spec_decode/acceptance.py."""
    return trace_acceptance_stats(upto(trace, step))


def draft_acceptance_figure(trace: Trace, *, step: int | None = None) -> go.Figure:
    """The proposals up to `step` (the whole run for None) in the frame of the whole run: its
    requests, steps and k, so that scrubbing never moves anything. A trace without speculation, or
    with no proposal yet, gives a figure that says so."""
    info = trace.info
    if info.speculative_method is None:
        return _notice("this engine does not speculate (speculative_method=None): pass speculative_config to LLM")
    if not any(proposals(trace)):
        return _notice("no steps yet" if not trace.events else "no drafts yet: nothing has speculated")
    # The frame: bands for the whole run's speculating requests, each k + 1 rows tall (the drafts
    # and a bonus token) plus one of space, k being the longest proposal's; columns for its steps.
    rows = list(dict.fromkeys(seq.request_id for _, seq in proposals(trace)))
    depth = max([info.num_speculative_tokens, *(len(seq.spec_token_ids) for _, seq in proposals(trace))])
    pitch = depth + 2
    run_steps = steps(trace)
    first, last = run_steps[0], run_steps[-1]
    cell = max(3, min(14, (WIDTH - MARGIN["l"] - MARGIN["r"]) // (last - first + 1) - 1))
    grid = len(rows) * pitch * (cell + 1)  # px: a row as tall as a column is wide, so squares are square
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[grid, LINE_PANEL],
                        vertical_spacing=GAP / (grid + GAP + LINE_PANEL))

    shown = upto(trace, step)
    marks = {name: _Marks() for name in ("accepted", "rejected", "not judged", "target's token")}
    for at, seq in proposals(shown):
        _mark(marks, at, seq, rows.index(seq.request_id) * pitch)
    for (name, m), color in zip(marks.items(), (ACCEPTED_COLOR, REJECTED_COLOR, UNJUDGED_COLOR, TOTAL_COLOR)):
        target = name == "target's token"
        fig.add_trace(go.Scatter(
            x=m.x, y=m.y, name=name, mode="markers", hovertext=m.text, hoverinfo="text",
            marker=dict(symbol="circle" if target else "square", size=max(3, cell // 2) if target else cell,
                        color=color)), row=1, col=1)

    x, measured, formula, measured_text, formula_text = _running(shown, info.num_speculative_tokens)
    plot = grid + GAP + LINE_PANEL
    fig.add_trace(total_line(x, measured, name="tokens per target call", text=measured_text), row=2, col=1)
    fig.add_trace(line(x, formula, name=FORMULA_NAME, color=FORMULA_COLOR, dash="dash",
                       text=formula_text), row=2, col=1)

    k = info.num_speculative_tokens
    fig.update_layout(
        title=dict(text=f"Draft acceptance · {info.speculative_method}, k={k}"
                        f"<br><sup>{_caption(shown, step)}</sup>", x=0.02, xanchor="left"),
        width=WIDTH, height=MARGIN["t"] + plot + MARGIN["b"], template="plotly_white", margin=MARGIN,
        hovermode="closest", legend=dict(orientation="h", x=0, y=-LEGEND_BELOW / plot, yanchor="top"))
    fig.update_xaxes(range=[first - 0.5, last + 0.5], tickformat="d")
    fig.update_xaxes(title=dict(text="engine step"), row=2, col=1)
    fig.update_yaxes(range=[len(rows) * pitch - 1, -1], showgrid=False, zeroline=False, tickvals=[
        r * pitch + depth / 2 for r in range(len(rows))], ticktext=[_row_label(r) for r in rows], row=1, col=1)
    fig.update_yaxes(title=dict(text="tokens per<br>target call"), range=[0, (k + 1) * HEADROOM],
                     row=2, col=1)
    return fig


@dataclass
class _Marks:
    x: list[int] = field(default_factory=list)
    y: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def add(self, x: int, y: int, text: str) -> None:
        self.x.append(x)
        self.y.append(y)
        self.text.append(text)


def _mark(marks: dict[str, _Marks], step: int, seq: SeqState, band: int) -> None:
    """One proposal's squares at `step`, from the band's top row down, and its target token."""
    proposed, accepted = len(seq.spec_token_ids), seq.num_accepted_tokens
    where = f"request {seq.request_id} · step {step}"
    for i, token in enumerate(seq.spec_token_ids):
        name = "accepted" if i < accepted else "rejected" if i == accepted else "not judged"
        marks[name].add(step, band + i, f"{where}<br>draft position {i + 1} of {proposed}: token {token}<br>"
                                        f"{OUTCOMES[name]}")
    if seq.target_token_id is not None:
        kind = (f"bonus: all {proposed} drafts accepted" if accepted == proposed
                else f"recovered in place of rejected draft {accepted + 1}")
        marks["target's token"].add(step, band + accepted,
                                    f"{where}<br>target's token {seq.target_token_id}<br>{kind}")


def _running(shown: Trace, k: int) -> tuple[list[int], list[float | None], list[float | None], list[str | None],
                                           list[str | None]]:
    """Per step: measured tokens per target call so far, the formula at alpha so far, and their
    hover texts; None before the first proposal."""
    counts = AcceptanceCounts(k)
    x: list[int] = []
    measured: list[float | None] = []
    formula: list[float | None] = []
    measured_text: list[str | None] = []
    formula_text: list[str | None] = []
    for event in shown.events:
        for seq in event.seqs:
            if seq.spec_token_ids:
                counts.add(len(seq.spec_token_ids), seq.num_accepted_tokens)
        alpha, per_call, expected = counts.alpha, counts.tokens_per_call, counts.expected_tokens_per_call
        x.append(event.step)
        measured.append(per_call)
        formula.append(expected)
        measured_text.append(None if per_call is None else
                             f"{per_call:.2f} ({counts.accepted + counts.drafts} tokens / {counts.drafts} calls)")
        formula_text.append(None if expected is None else f"{expected:.2f} at α = {alpha:.2f}, k = {k}")
    return x, measured, formula, measured_text, formula_text


def _row_label(request_id: str) -> str:
    return f'<span style="color:{request_color(request_id)}">request {request_id}</span>'


def _caption(shown: Trace, step: int | None) -> str:
    s = acceptance_stats(shown)
    after = f"after step {shown.events[-1].step}" if shown.events else f"before step {step}"
    if s["alpha"] is None:
        return f"{after}: no drafts yet"
    return (f"{after}: α so far {s['alpha']:.2f} ({s['accepted_tokens']} accepted of {s['judged_tokens']} judged) "
            f"· {s['tokens_per_target_call']:.2f} tokens per target call, formula "
            f"{s['expected_tokens_per_target_call']:.2f} · vLLM's acceptance rate {s['acceptance_rate']:.0%}")


def _notice(message: str) -> go.Figure:
    """An empty chart whose title says why it is empty. Not in an annotation: a FigureWidget that
    next shows the full chart would keep it in the browser, though the new layout has none."""
    return go.Figure(layout=go.Layout(
        title=dict(text=f"Draft acceptance<br><sup>{message}</sup>", x=0.02, xanchor="left"), width=WIDTH,
        height=240, template="plotly_white", xaxis=dict(visible=False), yaxis=dict(visible=False)))
