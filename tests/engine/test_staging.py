"""Staging a step's values into persistent buffers: the front rows written, the rest padded; on a GPU
through a pinned host mirror that is overwritten only after its previous copy finished (the copy
itself is tested in tests/kernels/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from minillm.utils import staging
from minillm.utils.staging import HostMirror, host_mirror, stage


def test_values_go_to_the_front_of_the_buffer_and_padding_after_them():
    buffer = torch.full((8,), 7, dtype=torch.int32)
    view = stage(buffer, [1, 2, 3], num_rows=5, pad=-1)
    assert view.data_ptr() == buffer.data_ptr()  # the buffer itself, which a CUDA graph reads
    assert view.tolist() == [1, 2, 3, -1, -1] and buffer[5:].tolist() == [7, 7, 7]
    assert stage(buffer, [4, 5]).tolist() == [4, 5]
    own = stage(buffer, list(range(9)))  # more than the buffer holds: a tensor of its own
    assert own.tolist() == list(range(9)) and own.data_ptr() != buffer.data_ptr()


def test_only_cuda_buffers_get_a_mirror_and_no_pinned_memory_means_pageable_copies(monkeypatch):
    assert host_mirror(torch.zeros(4)) is None

    def no_pinned_memory(*args, **kwargs):
        raise RuntimeError("pin_memory=True requires a CUDA or other accelerator backend")

    monkeypatch.setattr(staging.torch, "empty", no_pinned_memory)
    assert staging._pinned_mirror(torch.zeros(4)) is None


def test_pinned_staging_can_be_turned_off_to_measure_it(monkeypatch):
    class CudaBuffer:  # stands for a CUDA tensor on a machine without one
        device = torch.device("cuda")

    monkeypatch.setattr(staging, "_mirrors", {})
    monkeypatch.setattr(staging, "_pinned_mirror", lambda buffer: "a mirror")
    monkeypatch.setenv("MINILLM_PINNED_STAGING", "0")
    assert host_mirror(CudaBuffer()) is None
    monkeypatch.delenv("MINILLM_PINNED_STAGING")
    assert host_mirror(CudaBuffer()) == "a mirror"


class FakeEvent:
    """Records when the host waited for the last copy out of the mirror, and what the mirror held then."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host, self.log = host, []

    def synchronize(self) -> None:
        self.log.append(("wait", self.host.tolist()))

    def record(self) -> None:
        self.log.append(("record", self.host.tolist()))


def test_a_mirror_is_overwritten_only_after_its_previous_copy_is_done():
    host = torch.zeros(4, dtype=torch.int64)
    event = FakeEvent(host)
    mirror = HostMirror(host, event)
    device = torch.full((4,), -1, dtype=torch.int64)
    mirror.copy_to(device[:3], [1, 2, 3])
    assert device.tolist() == [1, 2, 3, -1]
    mirror.copy_to(device[:2], [8, 9])
    assert device.tolist() == [8, 9, 3, -1]
    # Each copy waits for the one before, then writes the mirror, copies and records: the second
    # write found the first copy's values still there, untouched until the wait.
    assert event.log == [("wait", [0, 0, 0, 0]), ("record", [1, 2, 3, 0]),
                         ("wait", [1, 2, 3, 0]), ("record", [8, 9, 3, 0])]


@pytest.mark.parametrize("values", [[], [5]])
def test_a_mirror_copies_any_number_of_rows_it_holds_and_pads_the_rest(values):
    mirror = HostMirror(torch.zeros(2, dtype=torch.int32), FakeEvent(torch.zeros(1)))
    device = torch.full((3,), 3, dtype=torch.int32)
    mirror.copy_to(device[:2], values, pad=-1)
    assert device.tolist() == values + [-1] * (2 - len(values)) + [3]


def test_through_a_mirror_the_padding_travels_in_the_one_copy(monkeypatch):
    """On a GPU a separate fill of the padding rows would be a launch of its own, for every buffer
    of every step: the mirror holds the padding already when its copy is queued."""
    host = torch.zeros(6, dtype=torch.int32)
    event = FakeEvent(host)
    monkeypatch.setattr(staging, "host_mirror", lambda buffer: HostMirror(host, event))
    buffer = torch.full((6,), 7, dtype=torch.int32)
    monkeypatch.setattr(torch.Tensor, "fill_", lambda *args: pytest.fail("a fill of its own"))
    assert stage(buffer, [1, 2], num_rows=4, pad=-1).tolist() == [1, 2, -1, -1]
    assert buffer[4:].tolist() == [7, 7] and event.log[-1] == ("record", [1, 2, -1, -1, 0, 0])
