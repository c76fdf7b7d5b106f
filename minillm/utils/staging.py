"""Writing a step's values into tensors allocated once, instead of allocating new ones.

A CUDA graph captured at start-up reads its inputs from fixed addresses; the runner's token ids and
positions and the attention backends' metadata are therefore persistent tensors whose front rows
each step overwrites (engine/cuda_graph.py).

Each such tensor comes with a host array (vLLM's CpuGpuBuffer): a step writes its values, padding
included, into the array with numpy, which costs about a microsecond where each torch call on a
small tensor costs several. The buffers of one model runner share a `StagingArena`: their arrays lie
in one block of host memory and their tensors in one block of device memory, at the same offsets, so
that everything a step wrote reaches the device in one copy (`flush`), where a copy per buffer cost
the host a driver call, an event and a wait each, seven times a step (ranges far apart in the block
take a copy each; a step's lie close together). On a CPU the array is the tensor's own memory and
nothing is copied. On a GPU the host block is pinned: a copy from pageable memory makes the driver
stage it through a pinned buffer of its own while the host waits, where a copy from pinned memory is
queued and the host moves on. The block is written again only once the device has finished reading
it (an event recorded after each flush), so a step queued behind a long one cannot change the inputs
the long one is still copying.

What a step stages reaches the device only with the arena's flush, which must come before anything
on the device reads it, and once a step: the first write after a flush waits until that flush's
copy has read the block, and a copy is queued behind the device's work (with async scheduling,
behind the step still running), so the runner stages everything a step needs, then flushes. A
flush copies the whole span between the ranges it merges: a buffer's rows beyond what its step
staged get whatever the host array holds, so values written on the device alone (a draft model's
positions moved on by a small graph) last only until the next flush, and every step stages what it
reads.

MINILLM_PINNED_STAGING=0 copies from pageable memory instead, to measure what pinning buys. (On an
H100 a step's prepare phase took 460 µs when each buffer's values went through torch calls into a
pinned mirror, where an engine before the mirrors took 166: the GPU check of 2026-11-27, tiny at
batch 1. Those torch calls are what the numpy writes replace; the one copy per step replaced one per
buffer later.)
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

# Where each buffer starts in the blocks: a multiple of this many bytes, so that a kernel finds every
# tensor as aligned as one of its own (Triton compiles aligned pointers apart).
ALIGNMENT = 256
# Two written ranges closer than this are copied together, the gap with them: copying 64 KiB more
# takes a GPU about as long as the host takes to issue one more copy.
MERGE_GAP = 64 * 1024


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


class StagingArena:
    """The host and device memory of a model runner's staged buffers, and the copy between them.
    Buffers are laid out as they are asked for (`buffer`); the memory is allocated the first time any
    of them is used, after which no buffer can be added."""

    # Tests set this: a CPU's buffers then get host arrays of their own, copied as a GPU's are, so that
    # a value staged and never flushed shows up as a wrong result on a CPU too.
    separate_host_on_cpu = False

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._buffers: list[tuple[CpuGpuBuffer, int]] = []  # each with its offset in bytes
        self._size = 0
        self.host: torch.Tensor | None = None  # the blocks, bytes; the same tensor where nothing is copied
        self.device_block: torch.Tensor | None = None
        self._dirty: list[tuple[int, int]] = []  # byte ranges written since the last flush
        self._copied: torch.cuda.Event | None = None  # recorded after each copy out of a pinned block
        self._in_flight = False  # whether a flush since the last wait may still be reading the host block
        self.num_copies = 0  # copies made by flushes, which the tests count

    def buffer(self, *shape: int, dtype: torch.dtype, fill: int = 0) -> CpuGpuBuffer:
        if self.host is not None:
            raise RuntimeError("a StagingArena's buffers are all asked for before any of them is used")
        buffer = CpuGpuBuffer(self, shape, dtype, fill)
        self._buffers.append((buffer, self._size))
        self._size += -(-buffer.nbytes // ALIGNMENT) * ALIGNMENT
        return buffer

    def allocate(self) -> None:
        if self.host is not None:
            return
        size = max(self._size, ALIGNMENT)
        self.device_block = torch.empty(size, dtype=torch.uint8, device=self.device)
        if self.device.type == "cpu" and not self.separate_host_on_cpu:
            self.host = self.device_block  # writing the arrays writes the tensors
        else:
            self.host, pinned = host_tensor(self.device_block, self.device.type == "cuda" and pinned_staging())
            self._copied = torch.cuda.Event() if pinned else None
        for buffer, offset in self._buffers:
            buffer._bind(self.host, self.device_block, offset)
        if self.host is not self.device_block:
            self.device_block.copy_(self.host)  # the fills

    def mark(self, start: int, end: int) -> None:
        """The host block's bytes [start, end) written, to be copied by the next flush; waits first, at
        a step's first write, until the last flush's copy has read the block."""
        if self.host is self.device_block:
            return  # the arrays are the tensors: nothing to copy
        if self._in_flight:
            self._copied.synchronize()
            self._in_flight = False
        self._dirty.append((start, end))

    def flush(self) -> None:
        """Everything staged since the last flush copied to the device: one copy per group of ranges
        less than MERGE_GAP apart, queued without waiting on CUDA."""
        if not self._dirty:
            return
        ranges, self._dirty = sorted(self._dirty), []
        merged = [list(ranges[0])]
        for start, end in ranges[1:]:
            if start - merged[-1][1] < MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        cuda = self.device.type == "cuda"
        for start, end in merged:
            # Off CUDA waited for: MPS would read the block only when the copy runs, after the next step
            # may have written it again.
            self.device_block[start:end].copy_(self.host[start:end], non_blocking=cuda)
        self.num_copies += len(merged)
        if self._copied is not None:
            self._copied.record(torch.cuda.current_stream(self.device))
            self._in_flight = True


class CpuGpuBuffer:
    """A device tensor allocated once (`tensor`) and the host array (`np`) that its values are written
    into first, both in a StagingArena's blocks; `fill` is every element's value until a step writes
    it. Made by `StagingArena.buffer`."""

    def __init__(self, arena: StagingArena, shape: tuple[int, ...], dtype: torch.dtype, fill: int) -> None:
        self.arena = arena
        self.shape, self.dtype, self.fill = shape, dtype, fill
        self.row_bytes = math.prod(shape[1:]) * dtype.itemsize
        self.nbytes = shape[0] * self.row_bytes
        self._offset = 0
        self._tensor: torch.Tensor | None = None  # the three views, once the arena is allocated
        self._cpu: torch.Tensor | None = None
        self._np = None

    def _bind(self, host: torch.Tensor, device_block: torch.Tensor, offset: int) -> None:
        self._offset = offset

        def view(block: torch.Tensor) -> torch.Tensor:
            return block[offset:offset + self.nbytes].view(self.dtype).view(self.shape)

        self._cpu = view(host)
        self._cpu.fill_(self.fill)
        self._tensor = view(device_block)
        self._np = self._cpu.numpy()

    @property
    def tensor(self) -> torch.Tensor:
        """On the device."""
        self.arena.allocate()
        return self._tensor

    @property
    def cpu(self) -> torch.Tensor:
        """The host array as a tensor."""
        self.arena.allocate()
        return self._cpu

    @property
    def np(self):
        self.arena.allocate()
        return self._np

    def stage(self, values: Sequence[int], num_rows: int | None = None, pad: int = 0) -> torch.Tensor:
        """values written to the front rows, rows up to num_rows set to pad; returns that view of the
        tensor, which holds them once the arena is flushed."""
        n = len(values)
        array = self.np
        if n > array.shape[0]:
            # Only a step without a KV cache feeds more tokens than the step budget: it gets its own tensor.
            return torch.tensor(values, dtype=self.dtype, device=self._tensor.device)
        rows = n if num_rows is None else num_rows
        self.arena.mark(self._offset, self._offset + rows * self.row_bytes)
        array[:n] = values
        array[n:rows] = pad
        return self._tensor[:rows]

    def stage_rows(self, rows: Sequence[Sequence[int]], width: int) -> torch.Tensor:
        """Each of rows written to the front of a row of a 2-D buffer, the rest of its first `width`
        entries set to 0; returns the view [:len(rows), :width]. Whole rows are copied: one contiguous
        range, where their first `width` entries alone would be a strided one."""
        array = self.np
        if len(rows) > array.shape[0]:
            raise ValueError(f"{len(rows)} rows staged into a buffer of {array.shape[0]}")
        self.arena.mark(self._offset, self._offset + len(rows) * self.row_bytes)
        for host_row, row in zip(array, rows):
            host_row[:len(row)] = row
            host_row[len(row):width] = 0
        return self._tensor[:len(rows), :width]
