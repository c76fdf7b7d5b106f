"""BlockPool: the block grid drawn from a hand-made trace (every square where the events put it), and
live on a real engine. Also run with Colab's widget versions (tests/course/test_widgets_colab.py)."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from minillm import LLM, SamplingParams
from minillm.engine.trace import SeqState, StepEvent, Trace, TraceInfo
from minillm.widgets import BlockPool, block_pool_figure, request_color

INFO = TraceInfo(model="tiny", device="cpu", dtype="float32", kv_cache="paged", kv_bytes_per_token=100,
                 device_memory_bytes=10**9, max_model_len=64, max_num_seqs=4, block_size=4, num_kv_blocks=12)


def state(request_id: str, table: tuple[int, ...], kv: int, *, finish: str | None = None, hits: int = 0) -> SeqState:
    return SeqState(request_id, prefill_tokens=0, decode_tokens=1, kv_tokens=kv, kv_reserved_tokens=4 * len(table),
                    finish_reason=finish, block_table=table, num_cached_tokens=hits)


def hand_trace() -> Trace:
    # Requests 0 and 1 share block 2 (a cached prefix); block 5 is free but still cached.
    return Trace(INFO, [
        StepEvent(0, (state("0", (2, 7), 6),), 0, num_free_blocks=10, cached_blocks=(2,)),
        StepEvent(1, (state("0", (2, 7), 7), state("1", (2, 3, 9), 9, hits=4)), 0, num_free_blocks=8,
                  cached_blocks=(2, 5)),
        StepEvent(2, (state("0", (2, 7), 8, finish="length"), state("1", (2, 3, 9), 10)), 0, num_free_blocks=9,
                  cached_blocks=(2, 5, 7)),
    ])


def squares(fig: go.Figure) -> dict[str, dict[int, dict]]:
    """legend name -> block id -> what its square shows (position, ring, label)."""
    columns = int(fig.layout.xaxis.range[1])
    out: dict[str, dict[int, dict]] = {}
    for trace in fig.data:
        widths = trace.marker.line.width
        for i, (x, y) in enumerate(zip(trace.x, trace.y)):
            out.setdefault(trace.name, {})[y * columns + x] = {
                "ring": widths[i] > 0, "label": trace.text[i], "hover": trace.hovertext[i]}
    return out


def test_every_block_is_drawn_once_coloured_by_its_holder() -> None:
    fig = block_pool_figure(hand_trace(), step=1)
    grid = squares(fig)
    assert set(grid) == {"free", "request 0", "request 1"}
    assert sorted(b for blocks in grid.values() for b in blocks) == list(range(12))
    assert set(grid["request 0"]) == {2, 7} and set(grid["request 1"]) == {3, 9}
    colors = {t.name: t.marker.color for t in fig.data}
    assert colors["request 0"] == request_color("0") and colors["request 1"] == request_color("1")
    shared = grid["request 0"][2]
    assert shared["ring"] and shared["label"] == "2" and "shared by 2" in shared["hover"]
    assert "request 1: its block 0" in shared["hover"] and "request 1: its block 2" in grid["request 1"][9]["hover"]
    assert grid["free"][5]["ring"] and "still holds a cached prefix" in grid["free"][5]["hover"]
    assert not grid["free"][0]["ring"]
    caption = fig.layout.title.text
    assert "after step 1: 4 held (1.6 kB), 8 free, 2 cached" in caption and "prefix hits 4 tokens" in caption
    # Shared block 2 holds 4 tokens once, not once per sharer: 4 + 3 (block 7) + 4 (block 3) + 1 (block 9)
    # of 16 slots, where adding up the requests' 7 + 9 tokens would read 100%.
    assert "75% of held slots filled" in caption, caption


def test_finished_requests_blocks_are_back_and_scrubbing_moves_in_time() -> None:
    last = squares(block_pool_figure(hand_trace()))
    assert "request 0" not in last and {2, 7} <= set(last["request 1"]) | set(last["free"])
    assert last["free"][7]["ring"]  # request 0 left its last block behind as a cached prefix
    first = squares(block_pool_figure(hand_trace(), step=0))
    assert set(first) == {"free", "request 0"}
    assert block_pool_figure(hand_trace()).to_json() == block_pool_figure(hand_trace()).to_json()


def test_needs_a_paged_trace() -> None:
    contiguous = Trace(TraceInfo(**{**vars(INFO), "kv_cache": "contiguous"}), [])
    with pytest.raises(ValueError, match="kv_cache='contiguous'"):
        block_pool_figure(contiguous)
    with pytest.raises(ValueError, match="BlockPool shows the paged KV cache"):
        BlockPool(contiguous)
    assert "no steps yet" in block_pool_figure(Trace(INFO, [])).layout.title.text


def test_live_on_a_real_engine(tiny_llm: LLM) -> None:
    with BlockPool(tiny_llm, min_interval=0) as view:
        tiny_llm.generate(["def f(x):", "import os\n"], SamplingParams(max_tokens=20, ignore_eos=True),
                          use_tqdm=False)
    assert not view.attached and len(view.trace.events) == 20
    blocks = tiny_llm.llm_engine.block_manager.num_blocks
    assert repr(view) == f"BlockPool(blocks={blocks}, steps=20, free={blocks})"
    middle = squares(view.figure(view.trace.events[10].step))
    assert set(middle) == {"free", *(f"request {r}" for r in view.trace.request_ids)}
    assert sum(len(b) for b in middle.values()) == min(blocks, 1024)


def test_a_large_pool_draws_its_first_blocks() -> None:
    big = Trace(TraceInfo(**{**vars(INFO), "num_kv_blocks": 5000}), hand_trace().events)
    fig = block_pool_figure(big, max_blocks=64)
    assert sum(len(t.x) for t in fig.data) == 64 and "blocks 0-63 of 5000" in fig.layout.title.text


def test_squares_stay_readable_and_the_legend_has_room() -> None:
    """The default pool drawn (1024 blocks) keeps 14 px squares, in as many rows as that takes, and
    the legend of every request of the run gets rows of its own below the grid, at every step."""
    info = TraceInfo(**{**vars(INFO), "num_kv_blocks": 1024})
    events = [StepEvent(i, tuple(state(str(r), (r,), 1) for r in range(i * 8, i * 8 + 8)), 0) for i in range(4)]
    heights = set()
    for step in range(4):
        fig = block_pool_figure(Trace(info, events), step=step)
        columns, rows = fig.layout.xaxis.range[1], fig.layout.yaxis.range[0]
        assert (columns, rows) == (40, 26) and {t.marker.size for t in fig.data} == {14}
        plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        assert plot_px >= (rows + 1) * 14 and fig.layout.margin.b >= 6 * 20  # 33 legend entries: 6 rows
        heights.add(fig.layout.height)
    assert len(heights) == 1
    few = block_pool_figure(Trace(info, events[:1]))  # 9 legend entries: 2 rows
    assert fig.layout.margin.b - few.layout.margin.b >= 4 * 20
