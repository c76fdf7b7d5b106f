"""Staging a step's values into persistent buffers: the front rows written, the rest padded, through a
host array written with numpy; on a CPU that array is the buffer itself, on a GPU a pinned one that
is overwritten only after its previous copy finished (the copy itself is tested in
tests/kernels/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from minillm.utils import staging
from minillm.utils.staging import CpuGpuBuffer


def test_values_go_to_the_front_of_the_buffer_and_padding_after_them():
    buffer = CpuGpuBuffer(8, dtype=torch.int32, device="cpu", fill=7)
    view = buffer.stage([1, 2, 3], num_rows=5, pad=-1)
    assert view.data_ptr() == buffer.tensor.data_ptr()  # the buffer itself, which a CUDA graph reads
    assert view.tolist() == [1, 2, 3, -1, -1] and buffer.tensor[5:].tolist() == [7, 7, 7]
    assert buffer.stage([4, 5]).tolist() == [4, 5]
    own = buffer.stage(list(range(9)))  # more than the buffer holds: a tensor of its own
    assert own.tolist() == list(range(9)) and own.data_ptr() != buffer.tensor.data_ptr()


def test_on_a_cpu_the_array_is_the_buffer_and_nothing_is_copied(monkeypatch):
    buffer = CpuGpuBuffer(4, dtype=torch.int64, device="cpu")
    assert buffer.cpu is buffer.tensor and buffer.np.ctypes.data == buffer.tensor.data_ptr()
    monkeypatch.setattr(torch.Tensor, "copy_", lambda *args, **kwargs: pytest.fail("a copy"))
    assert buffer.stage([3, 4], num_rows=3).tolist() == [3, 4, 0]


def test_rows_of_a_table_are_written_and_cleared_to_the_width_asked_for():
    tables = CpuGpuBuffer(3, 4, dtype=torch.int32, device="cpu", fill=9)
    assert tables.stage_rows([[1, 2, 3], [4]], width=3).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert tables.tensor[:, 3].tolist() == [9, 9, 9] and tables.tensor[2].tolist() == [9] * 4
    # A narrower step after a wider one: what the wider one left within the width is cleared.
    assert tables.stage_rows([[5], [6, 7]], width=2).tolist() == [[5, 0], [6, 7]]


def test_no_pinned_memory_means_pageable_copies_and_pinning_can_be_turned_off(monkeypatch):
    def no_pinned_memory(*args, pin_memory=False, **kwargs):
        if pin_memory:
            raise RuntimeError("pin_memory=True requires a CUDA or other accelerator backend")
        return torch.zeros(*args, **kwargs)

    monkeypatch.setattr(staging.torch, "empty", no_pinned_memory)
    host, pinned = staging.host_tensor(torch.zeros(4), pin=True)
    assert not pinned and host.shape == (4,)
    assert staging.pinned_staging()
    monkeypatch.setenv("MINILLM_PINNED_STAGING", "0")
    assert not staging.pinned_staging()


class FakeEvent:
    """Records when the host waited for the last copy out of the array, and what the array held then."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host, self.log = host, []

    def synchronize(self) -> None:
        self.log.append(("wait", self.host.tolist()))

    def record(self, stream) -> None:
        self.log.append(("record", self.host.tolist()))


def with_pinned_array(buffer: CpuGpuBuffer, monkeypatch) -> FakeEvent:
    """The buffer given a host array of its own and an event, as a GPU's buffer has: what a CPU can
    check of the copies' order."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    buffer.cpu = torch.zeros_like(buffer.tensor)
    buffer.np = buffer.cpu.numpy()
    buffer._copied = event = FakeEvent(buffer.cpu)
    return event


def test_an_array_is_overwritten_only_after_its_previous_copy_is_done(monkeypatch):
    buffer = CpuGpuBuffer(4, dtype=torch.int64, device="cpu", fill=-1)
    event = with_pinned_array(buffer, monkeypatch)
    buffer.stage([1, 2, 3])
    assert buffer.tensor.tolist() == [1, 2, 3, -1]
    buffer.stage([8, 9])
    assert buffer.tensor.tolist() == [8, 9, 3, -1]
    # Each copy waits for the one before, then writes the array, copies and records: the second
    # write found the first copy's values still there, untouched until the wait.
    assert event.log == [("wait", [0, 0, 0, 0]), ("record", [1, 2, 3, 0]),
                         ("wait", [1, 2, 3, 0]), ("record", [8, 9, 3, 0])]


@pytest.mark.parametrize("values", [[], [5]])
def test_an_array_copies_any_number_of_rows_it_holds_and_pads_the_rest(values, monkeypatch):
    buffer = CpuGpuBuffer(3, dtype=torch.int32, device="cpu", fill=3)
    with_pinned_array(buffer, monkeypatch)
    buffer.stage(values, num_rows=2, pad=-1)
    assert buffer.tensor.tolist() == values + [-1] * (2 - len(values)) + [3]


def test_the_padding_and_the_tables_travel_in_one_copy_each(monkeypatch):
    """On a GPU a separate fill of the padding rows would be a launch of its own, for every buffer
    of every step, and a strided table a copy kernel of its own: each array holds its padding
    already when its one contiguous copy is queued."""
    buffer = CpuGpuBuffer(6, dtype=torch.int32, device="cpu", fill=7)
    event = with_pinned_array(buffer, monkeypatch)
    tables = CpuGpuBuffer(3, 4, dtype=torch.int32, device="cpu")
    with_pinned_array(tables, monkeypatch)
    copies = []
    real_copy = torch.Tensor.copy_

    def copy(dst, src, non_blocking=False):
        copies.append((dst.is_contiguous() and src.is_contiguous(), non_blocking))
        return real_copy(dst, src, non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    monkeypatch.setattr(torch.Tensor, "fill_", lambda *args: pytest.fail("a fill of its own"))
    assert buffer.stage([1, 2], num_rows=4, pad=-1).tolist() == [1, 2, -1, -1]
    assert buffer.tensor[4:].tolist() == [7, 7] and event.log[-1] == ("record", [1, 2, -1, -1, 0, 0])
    assert tables.stage_rows([[1, 2], [3]], width=2).tolist() == [[1, 2], [3, 0]]
    # One contiguous copy each; off CUDA waited for, as MPS would read the array only when it runs.
    assert copies == [(True, False), (True, False)]
    with pytest.raises(ValueError, match="4 rows staged into a buffer of 3"):
        tables.stage_rows([[1]] * 4, width=1)
