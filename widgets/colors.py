"""One colour per request, the same in every view and every redraw.

The colour is a function of the request id alone (not of the order a view happens to see
requests in), so request "7" has the same colour in a cache chart, a block grid and a batch
timeline, recorded or live, even when a view sees only some of the requests.
"""

from __future__ import annotations

import zlib

# 32 colours, so that a batch of up to 32 requests with consecutive ids never repeats one: plotly's
# ten first (what a chart of a few requests has always shown), then 22 from plotly's Dark24,
# Alphabet, Light24, D3 and G10 palettes, each picked as the farthest from those before it. Any two
# differ by at least 20 in CIELAB (tests/course/test_widgets.py measures it), and none is as pale
# as a free block or as dark as a total line.
PALETTE: tuple[str, ...] = (
    "#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF", "#FECB52",
    "#316395", "#6C4516", "#FE00CE", "#B2828D", "#511CFB", "#109618", "#6C7C32", "#86CE00", "#DA16FF", "#990099",
    "#9467BD", "#AF0038", "#1C8356", "#B00068", "#B68100", "#FF7F0E", "#FB0D0D", "#FF0092", "#862A16", "#72B7B2",
    "#BCBD22", "#2E91E5",
)
TOTAL_COLOR = "#222222"  # sums over requests: dark, so they never read as one more request
RESERVED_FILL = "rgba(120, 120, 120, 0.18)"  # memory held but not used


def request_color(request_id: str) -> str:
    """Numeric ids (what `LLM.generate` assigns) cycle through the palette in order, so requests
    that run together differ; other ids are hashed with crc32, which, unlike `hash()`, is the same
    in every process."""
    index = int(request_id) if request_id.isdecimal() else zlib.crc32(request_id.encode())
    return PALETTE[index % len(PALETTE)]


def request_order(request_id: str) -> tuple[int, str]:
    """Sort key: numeric ids in numeric order, then the others."""
    return (int(request_id), "") if request_id.isdecimal() else (1 << 62, request_id)
