"""Staging a step's values into persistent buffers: the front rows written, the rest padded, through a
host array written with numpy; the buffers of one arena reach the device together, in one copy per
flush (a few where what a step wrote lies far apart). On a CPU an array is its buffer itself; with
host arrays of their own (a GPU's, or a CPU's under the tests, conftest.py) the host block is
overwritten only after the last flush's copy finished (the pinned copy itself is tested in
tests/kernels/test_gpu.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.utils import staging
from minillm.utils.staging import ALIGNMENT, MERGE_GAP, StagingArena


@pytest.fixture
def arena(monkeypatch) -> StagingArena:
    """An arena on the CPU whose arrays are its tensors, as outside the tests."""
    monkeypatch.setattr(StagingArena, "separate_host_on_cpu", False)
    return StagingArena("cpu")


@pytest.fixture
def copying() -> StagingArena:
    """An arena on the CPU with a host block of its own, copied as a GPU's is."""
    assert StagingArena.separate_host_on_cpu  # conftest.py
    return StagingArena("cpu")


def test_values_go_to_the_front_of_the_buffer_and_padding_after_them(arena):
    buffer = arena.buffer(8, dtype=torch.int32, fill=7)
    view = buffer.stage([1, 2, 3], num_rows=5, pad=-1)
    assert view.data_ptr() == buffer.tensor.data_ptr()  # the buffer itself, which a CUDA graph reads
    assert view.tolist() == [1, 2, 3, -1, -1] and buffer.tensor[5:].tolist() == [7, 7, 7]
    assert buffer.stage([4, 5]).tolist() == [4, 5]
    own = buffer.stage(list(range(9)))  # more than the buffer holds: a tensor of its own
    assert own.tolist() == list(range(9)) and own.data_ptr() != buffer.tensor.data_ptr()


def test_on_a_cpu_the_array_is_the_buffer_and_nothing_is_copied(arena, monkeypatch):
    buffer = arena.buffer(4, dtype=torch.int64)
    assert buffer.cpu.data_ptr() == buffer.tensor.data_ptr() == buffer.np.ctypes.data
    monkeypatch.setattr(torch.Tensor, "copy_", lambda *args, **kwargs: pytest.fail("a copy"))
    assert buffer.stage([3, 4], num_rows=3).tolist() == [3, 4, 0]
    arena.flush()
    assert arena.num_copies == 0


def test_rows_of_a_table_are_written_and_cleared_to_the_width_asked_for(arena):
    tables = arena.buffer(3, 4, dtype=torch.int32, fill=9)
    assert tables.stage_rows([[1, 2, 3], [4]], width=3).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert tables.tensor[:, 3].tolist() == [9, 9, 9] and tables.tensor[2].tolist() == [9] * 4
    # A narrower step after a wider one: what the wider one left within the width is cleared.
    assert tables.stage_rows([[5], [6, 7]], width=2).tolist() == [[5, 0], [6, 7]]
    with pytest.raises(ValueError, match="4 rows staged into a buffer of 3"):
        tables.stage_rows([[1]] * 4, width=1)


def test_buffers_share_two_blocks_each_aligned_and_are_all_asked_for_before_any_is_used(arena):
    first = arena.buffer(3, dtype=torch.int32, fill=-1)
    second = arena.buffer(2, 5, dtype=torch.int64, fill=4)
    assert first.tensor.tolist() == [-1] * 3 and second.tensor.tolist() == [[4] * 5] * 2  # allocated here
    start = arena.device_block.data_ptr()
    assert [t.data_ptr() - start for t in (first.tensor, second.tensor)] == [0, ALIGNMENT]
    with pytest.raises(RuntimeError, match="asked for before any of them is used"):
        arena.buffer(4, dtype=torch.int32)


def test_staged_values_reach_the_device_with_the_flush_and_far_ranges_take_a_copy_each(copying):
    near = copying.buffer(8, dtype=torch.int32, fill=7)
    table = copying.buffer(2, 3, dtype=torch.int32)
    far = copying.buffer(MERGE_GAP, dtype=torch.int64)  # its front lies MERGE_GAP * 8 bytes from its end
    after = copying.buffer(4, dtype=torch.int32)
    view = near.stage([1, 2], num_rows=3, pad=-1)
    table.stage_rows([[5, 6]], width=2)
    assert view.tolist() == [7, 7, 7] and near.cpu[:3].tolist() == [1, 2, -1]  # written on the host only
    copying.flush()
    assert view.tolist() == [1, 2, -1] and table.tensor.tolist() == [[5, 6, 0], [0, 0, 0]]
    assert copying.num_copies == 1  # both in one copy
    far.stage([3])
    after.stage([4, 4])
    copying.flush()
    assert far.tensor[:2].tolist() == [3, 0] and after.tensor.tolist() == [4, 4, 0, 0]
    assert copying.num_copies == 3  # the far buffer's front and the next buffer lie MERGE_GAP apart and more
    copying.flush()
    assert copying.num_copies == 3  # nothing staged since: nothing copied


def test_a_flush_copies_every_range_staged_in_any_order_padding_included(copying):
    """A step stages its buffers in whatever order its code runs, and a buffer's padding rows are
    staged as much as its values: the later buffer first, its padding the last bytes written."""
    first = copying.buffer(4, dtype=torch.int32, fill=7)
    second = copying.buffer(4, dtype=torch.int32, fill=7)
    second.stage([5], num_rows=3, pad=-1)
    first.stage([1, 2])
    copying.flush()
    assert first.tensor.tolist() == [1, 2, 7, 7] and second.tensor.tolist() == [5, -1, -1, 7]
    assert copying.num_copies == 1


class FakeEvent:
    """Records when the host waited for the last copy out of the block, and what it held then."""

    def __init__(self, read: Callable[[], list]) -> None:
        self.read, self.log = read, []

    def synchronize(self) -> None:
        self.log.append(("wait", self.read()))

    def record(self, stream) -> None:
        self.log.append(("record", self.read()))


def test_the_host_block_is_overwritten_only_after_the_last_flush_copied_it(copying, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    ids, lens = copying.buffer(2, dtype=torch.int8), copying.buffer(2, dtype=torch.int8)
    copying.allocate()
    copying._copied = event = FakeEvent(lambda: ids.cpu.tolist() + lens.cpu.tolist())
    ids.stage([1, 2])
    lens.stage([3])
    copying.flush()
    ids.stage([5])  # the next step: its first write waits for the copy, its second does not
    lens.stage([6, 7])
    copying.flush()
    # The wait found the first step's values still there, untouched until then.
    assert event.log == [("record", [1, 2, 3, 0]), ("wait", [1, 2, 3, 0]), ("record", [5, 2, 6, 7])]
    assert ids.tensor.tolist() == [5, 2] and lens.tensor.tolist() == [6, 7]


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


@pytest.mark.parametrize("args,copies_per_step", [({}, 1), ({"async_scheduling": True}, 1),
                                                   ({"speculative_config": {"model": "tiny-draft",
                                                                            "num_speculative_tokens": 3}}, 2)])
def test_a_decode_step_reaches_the_device_in_one_copy_a_speculative_one_in_two(args, copies_per_step):
    """The padded path of the CUDA graphs, run eagerly: every buffer of the step (token ids, positions,
    logits rows, the attention metadata, the rows of tokens taken on the device) in one flush of one
    copy; a speculative step flushes the draft's first step and the target's. With the default 256
    sequences, each model's block tables (128 KiB) lie between the other's buffers and its own."""
    llm = LLM("tiny", device="cpu", dtype="float32", skip_tokenizer_init=True, **args)
    engine = llm.llm_engine
    engine.model_runner.capture_cuda_graphs(capture=False)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(3):
        engine.add_request(str(i), {"prompt_token_ids": [3 + i] * (4 + i)}, params)
    for _ in range(4):  # past the prompts
        engine.step()
    arena = engine.model_runner.buffers.arena
    before = arena.num_copies
    for _ in range(5):
        engine.step()
    assert arena.num_copies - before == 5 * copies_per_step
