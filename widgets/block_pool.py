"""The paged KV pool after one step, block by block: a grid with one square per block, coloured by
the request that holds it; grey when free. A ring marks a block holding a cached prefix (it can be
shared, and survives its owner until the pool needs it back); a number inside counts the requests
sharing it. Hovering a block tells whose block it is and which of their logical blocks it holds.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from minillm.engine.trace import StepEvent, Trace

from .colors import request_color, request_order
from .formatting import format_bytes, format_percent

FREE_COLOR = "#e6e6e6"
CACHED_RING = "#222222"
WIDTH = 760  # px, with the height fixed by the pool's shape, so that a live redraw never moves the page
MAX_BLOCKS = 1024  # drawn at most; the pool hands out low block ids first, so activity shows there
MAX_COLUMNS = 40  # so that a square is at least 14 px: its colour and its sharer count stay readable
LEGEND_PER_ROW = 6  # entries ("request 12") in a row of the legend at WIDTH
LEGEND_ROW_PX = 22


def pool_state(event: StepEvent) -> dict[int, list[tuple[str, int]]]:
    """block id -> [(request id, logical block index), ...] of every request holding it."""
    owners: dict[int, list[tuple[str, int]]] = {}
    for seq in event.seqs:
        if seq.finish_reason is None:  # a finished request's blocks went back in the same step
            for logical, block_id in enumerate(seq.block_table):
                owners.setdefault(block_id, []).append((seq.request_id, logical))
    return owners


def block_pool_figure(trace: Trace, *, step: int | None = None, columns: int | None = None,
                      max_blocks: int = MAX_BLOCKS) -> go.Figure:
    """The pool after `step` (the last step for None), its first `max_blocks` blocks. Needs a trace
    of the paged cache."""
    info = trace.info
    if info.kv_cache != "paged":
        raise ValueError(f"block_pool_figure draws the paged cache; this trace has kv_cache={info.kv_cache!r}")
    events = [e for e in trace.events if step is None or e.step <= step]
    event = events[-1] if events else None
    num_blocks = min(info.num_kv_blocks, max_blocks)
    columns = columns or max(8, min(MAX_COLUMNS, math.ceil(math.sqrt(num_blocks * 2))))
    rows = math.ceil(num_blocks / columns)
    owners = pool_state(event) if event else {}
    cached = set(event.cached_blocks) if event else set()

    groups: dict[str, list[int]] = {}  # legend entry -> blocks drawn in its colour
    for block_id in range(num_blocks):
        held = owners.get(block_id)
        groups.setdefault(held[0][0] if held else "free", []).append(block_id)
    fig = go.Figure()
    cell = min(22, max(6, (WIDTH - 120) // columns - 2))
    for name, blocks in sorted(groups.items(), key=lambda kv: (kv[0] != "free", request_order(kv[0]))):
        fig.add_trace(go.Scatter(
            x=[b % columns for b in blocks], y=[b // columns for b in blocks], mode="markers+text",
            name="free" if name == "free" else f"request {name}",
            marker=dict(symbol="square", size=cell, color=FREE_COLOR if name == "free" else request_color(name),
                        line=dict(width=[2 if b in cached else 0 for b in blocks], color=CACHED_RING)),
            text=[str(len(owners[b])) if len(owners.get(b, ())) > 1 else "" for b in blocks],
            textfont=dict(color="white", size=max(7, cell - 6)),
            hovertext=[_describe(b, owners.get(b, []), b in cached) for b in blocks], hoverinfo="text"))
    # Room below the grid for a legend of every request of the run (and "free"), so that the grid
    # keeps its size as requests come and go, and scrubbing never moves the page.
    legend_px = math.ceil((len(trace.request_ids) + 1) / LEGEND_PER_ROW) * LEGEND_ROW_PX
    margin = dict(l=40, r=20, t=80, b=10 + legend_px)
    plot_px = (rows + 1) * (cell + 2)  # the y range spans rows + 1
    fig.update_layout(
        title=dict(text=f"KV block pool · {_blocks_shown(num_blocks, info.num_kv_blocks)} of {info.block_size} tokens"
                        f"<br><sup>{_caption(trace, event, owners, cached)}</sup>"),
        width=WIDTH, height=margin["t"] + plot_px + margin["b"], template="plotly_white", margin=margin,
        legend=dict(orientation="h", y=-4 / plot_px, yanchor="top"), showlegend=True)
    fig.update_xaxes(visible=False, range=[-1, columns])
    fig.update_yaxes(visible=False, range=[rows, -1])  # block 0 at the top left, reading order
    return fig


def _blocks_shown(shown: int, total: int) -> str:
    return f"{total} blocks" if shown == total else f"blocks 0-{shown - 1} of {total}"


def _describe(block_id: int, holders: list[tuple[str, int]], cached: bool) -> str:
    lines = [f"block {block_id}"]
    lines += [f"request {r}: its block {logical}" for r, logical in holders]
    if not holders:
        lines.append("free" + (", still holds a cached prefix" if cached else ""))
    elif cached:
        lines.append("cached prefix" + (f", shared by {len(holders)}" if len(holders) > 1 else ""))
    return "<br>".join(lines)


def _caption(trace: Trace, event: StepEvent | None, owners: dict, cached: set[int]) -> str:
    if event is None:
        return "no steps yet"
    info = trace.info
    held = len(owners)
    hits = sum(s.num_cached_tokens for s in event.seqs)
    block_bytes = info.block_size * info.kv_bytes_per_token
    return (f"after step {event.step}: {held} held ({format_bytes(held * block_bytes)}), "
            f"{event.num_free_blocks} free, {len(cached)} cached · "
            f"{format_percent(_filled_slots(event, owners, info.block_size) / max(1, held * info.block_size))} "
            "of held slots filled · "
            f"prefix hits {hits} tokens")


def _filled_slots(event: StepEvent, owners: dict[int, list[tuple[str, int]]], block_size: int) -> int:
    """Token slots holding K/V in the held blocks, each block counted once however many requests
    share it: a shared prefix block is one block's worth of tokens, not one per sharer."""
    kv_tokens = {s.request_id: s.kv_tokens for s in event.seqs}
    # A block reserved ahead of its tokens (lookahead slots) holds none yet.
    return sum(max(0, *(min(block_size, kv_tokens.get(request, 0) - logical * block_size)
                        for request, logical in holders)) for holders in owners.values())
