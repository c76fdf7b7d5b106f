"""One colour per request, the same in every view and every redraw.

The colour is a function of the request id alone (not of the order a view happens to see
requests in), so request "7" has the same colour in a cache chart, a block grid and a batch
timeline, recorded or live, even when a view sees only some of the requests.
"""

from __future__ import annotations

import zlib

from plotly.colors import qualitative

PALETTE: tuple[str, ...] = tuple(qualitative.Plotly)
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
