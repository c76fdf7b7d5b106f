"""Writing a step's values into tensors allocated once, instead of allocating new ones.

A CUDA graph captured at start-up reads its inputs from fixed addresses; the runner's token ids and
positions and the attention backends' metadata are therefore persistent tensors whose front rows
each step overwrites (engine/cuda_graph.py).

On a GPU the values travel through a pinned host mirror of each buffer: a copy from pageable memory
makes the driver stage it through a pinned buffer of its own while the host waits, where a copy
from pinned memory is queued and the host moves on (vLLM keeps its input buffers the same way). A
mirror is written again only once the device has finished reading it (an event recorded after each
copy), so a step queued behind a long one cannot change the inputs the long one is still copying.
MINILLM_PINNED_STAGING=0 copies from pageable memory instead, to measure what the mirrors buy: on an
H100 a step's prepare phase took 460 µs with them, where an engine before them took 166 (the GPU
check of 2026-11-27, tiny at batch 1), a difference not yet measured apart.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch.utils.weak import WeakTensorKeyDictionary


class HostMirror:
    """A pinned host tensor shaped like one device buffer, and the event of its last copy to it."""

    def __init__(self, host: torch.Tensor, event) -> None:
        self.host = host
        self.copied = event  # recorded after each copy; an event never recorded is complete

    def copy_to(self, view: torch.Tensor, values: Sequence[int], pad: int = 0) -> None:
        """values into the front rows of view (a view of the mirrored buffer) and pad into the rest, in
        one copy that the host does not wait for: padding written here costs no launch of its own."""
        self.copied.synchronize()  # the previous copy out of the mirror is done: it may be overwritten
        n, rows = len(values), view.shape[0]
        self.host[:n] = torch.tensor(values, dtype=self.host.dtype)
        self.host[n:rows] = pad
        view.copy_(self.host[:rows], non_blocking=True)
        self.copied.record()


# Device buffer -> its mirror (None where pinned memory could not be had); gone with the buffer.
_mirrors = WeakTensorKeyDictionary()


def _pinned_mirror(buffer: torch.Tensor) -> HostMirror | None:
    try:
        host = torch.empty(buffer.shape, dtype=buffer.dtype, pin_memory=True)
    except RuntimeError:  # no page-locked memory to be had (a locked-memory limit): pageable copies
        return None
    return HostMirror(host, torch.cuda.Event())


def host_mirror(buffer: torch.Tensor) -> HostMirror | None:
    """The mirror of a CUDA buffer, made at its first use; None on other devices (whose copies are
    synchronous anyway), where pinned memory is not available, or with MINILLM_PINNED_STAGING=0."""
    if buffer.device.type != "cuda" or os.environ.get("MINILLM_PINNED_STAGING", "1") == "0":
        return None
    if buffer not in _mirrors:
        _mirrors[buffer] = _pinned_mirror(buffer)
    return _mirrors[buffer]


def stage(buffer: torch.Tensor, values: Sequence[int], num_rows: int | None = None,
          pad: int = 0) -> torch.Tensor:
    """values written to the front of buffer, rows up to num_rows set to pad; returns that view."""
    n = len(values)
    if n > buffer.shape[0]:
        # Only a step without a KV cache feeds more tokens than the step budget: it gets its own tensor.
        return torch.tensor(values, dtype=buffer.dtype, device=buffer.device)
    view = buffer[:n if num_rows is None else num_rows]
    mirror = host_mirror(buffer)
    if mirror is None:
        view[:n].copy_(torch.tensor(values, dtype=buffer.dtype), non_blocking=True)
        view[n:].fill_(pad)
    else:
        mirror.copy_to(view, values, pad)
    return view
