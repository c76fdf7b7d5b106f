"""Writing a step's values into tensors allocated once, instead of allocating new ones.

A CUDA graph captured at start-up reads its inputs from fixed addresses; the runner's token ids and
positions and the attention backends' metadata are therefore persistent tensors whose front rows
each step overwrites (engine/cuda_graph.py).

Each such tensor comes with a host array (vLLM's CpuGpuBuffer). A step writes its values, padding
included, into the array with numpy, which costs about a microsecond where each torch call on a
small tensor costs several, then copies the rows it wrote to the device in one copy. On a CPU the
array is the tensor's own memory and nothing is copied. On a GPU the array is pinned: a copy from
pageable memory makes the driver stage it through a pinned buffer of its own while the host waits,
where a copy from pinned memory is queued and the host moves on. A pinned array is written again
only once the device has finished reading it (an event recorded after each copy), so a step queued
behind a long one cannot change the inputs the long one is still copying.

MINILLM_PINNED_STAGING=0 copies from pageable memory instead, to measure what pinning buys. (On an
H100 a step's prepare phase took 460 µs when each buffer's values went through torch calls into a
pinned mirror, where an engine before the mirrors took 166: the GPU check of 2026-11-27, tiny at
batch 1. Those torch calls are what the numpy writes replace.)
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch


def pinned_staging() -> bool:
    return os.environ.get("MINILLM_PINNED_STAGING", "1") != "0"


def host_tensor(like: torch.Tensor, pin: bool) -> tuple[torch.Tensor, bool]:
    """A host tensor shaped like `like`, pinned if asked and possible; and whether it is pinned."""
    if pin:
        try:
            return torch.empty(like.shape, dtype=like.dtype, pin_memory=True), True
        except RuntimeError:  # no page-locked memory to be had (a locked-memory limit): pageable copies
            pass
    return torch.empty(like.shape, dtype=like.dtype), False


class CpuGpuBuffer:
    """A device tensor allocated once (`tensor`) and the host array (`np`) that its values are written
    into first; `fill` is every element's value until a step writes it."""

    def __init__(self, *shape: int, dtype: torch.dtype, device: torch.device | str, fill: int = 0) -> None:
        self.tensor = torch.full(shape, fill, dtype=dtype, device=device)
        if self.tensor.device.type == "cpu":
            self.cpu, pinned = self.tensor, False  # the same memory: writing the array writes the tensor
        else:
            self.cpu, pinned = host_tensor(self.tensor, self.tensor.device.type == "cuda" and pinned_staging())
            self.cpu.fill_(fill)
        self.np = self.cpu.numpy()
        # Recorded after each copy out of a pinned array; an event never recorded is complete.
        self._copied = torch.cuda.Event() if pinned else None

    def stage(self, values: Sequence[int], num_rows: int | None = None, pad: int = 0) -> torch.Tensor:
        """values written to the front rows, rows up to num_rows set to pad; returns that view of the tensor."""
        n = len(values)
        if n > self.np.shape[0]:
            # Only a step without a KV cache feeds more tokens than the step budget: it gets its own tensor.
            return torch.tensor(values, dtype=self.tensor.dtype, device=self.tensor.device)
        rows = n if num_rows is None else num_rows
        self._writable()
        self.np[:n] = values
        self.np[n:rows] = pad
        return self._copy(rows)

    def stage_rows(self, rows: Sequence[Sequence[int]], width: int) -> torch.Tensor:
        """Each of rows written to the front of a row of a 2-D buffer, the rest of its first `width`
        entries set to 0; returns the view [:len(rows), :width]. Whole rows are copied: one contiguous
        copy, where their first `width` entries alone would be a strided one."""
        if len(rows) > self.np.shape[0]:
            raise ValueError(f"{len(rows)} rows staged into a buffer of {self.np.shape[0]}")
        self._writable()
        for host_row, row in zip(self.np, rows):
            host_row[:len(row)] = row
            host_row[len(row):width] = 0
        return self._copy(len(rows))[:, :width]

    def _writable(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy out of the array is done: it may be overwritten

    def _copy(self, rows: int) -> torch.Tensor:
        view = self.tensor[:rows]
        if self.cpu is not self.tensor:
            # Not waited for on CUDA: from pinned memory it is queued (the event guards the array), from
            # pageable memory it returns once the driver holds the bytes. MPS would read the array
            # only when the copy runs, after the next step may have overwritten it.
            view.copy_(self.cpu[:rows], non_blocking=self.tensor.is_cuda)
            if self._copied is not None:
                self._copied.record(torch.cuda.current_stream(self.tensor.device))
        return view
