"""Exercise 02's checks: they pass the solution, name common mistakes, refuse the untouched exercise,
and the engine check undoes whatever a wrong answer did to the engine's pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from minillm import LLM
from minillm.block_manager import BlockManager
from minillm.grading import checks_block_manager as checks
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "02_paged_kv_cache.ipynb"


@pytest.fixture(scope="module")
def solution() -> dict:
    namespace: dict = {}
    for cell in filter(is_solution, read(SOLUTION).cells):
        exec(cell.source, namespace)
    return namespace


def take_without_evicting(blocks, seq, num_tokens):
    while len(seq.block_table) < blocks.blocks_needed(num_tokens):
        block_id = next(iter(blocks.free_block_ids))
        del blocks.free_block_ids[block_id]
        blocks.blocks[block_id].ref_count += 1
        seq.block_table.append(block_id)


def take_from_the_back(blocks, seq, num_tokens):
    while len(seq.block_table) < blocks.blocks_needed(num_tokens):
        block_id = next(reversed(blocks.free_block_ids))
        blocks.evict(block_id)
        del blocks.free_block_ids[block_id]
        blocks.blocks[block_id].ref_count += 1
        seq.block_table.append(block_id)


def free_everything_to_the_front(blocks, seq):
    for block_id in reversed(seq.block_table):
        blocks.blocks[block_id].ref_count -= 1
        if blocks.blocks[block_id].ref_count == 0:
            blocks.free_block_ids[block_id] = None
            blocks.free_block_ids.move_to_end(block_id, last=False)
    seq.block_table = []


def free_ignoring_sharing(blocks, seq):
    for block_id in reversed(seq.block_table):
        block = blocks.blocks[block_id]
        block.ref_count = 0  # as if nobody else held it
        blocks.free_block_ids[block_id] = None
        blocks.free_block_ids.move_to_end(block_id, last=block.block_hash is not None)
    seq.block_table = []


def test_checks_pass_on_the_solution(solution, capsys):
    checks.check_append_slots(solution["append_slots"])
    checks.check_free(solution["free"])
    out = capsys.readouterr().out
    assert "check_append_slots passed" in out and "check_free passed" in out


@pytest.mark.parametrize("check, wrong, message", [
    ("check_append_slots", take_without_evicting, r"prefix cache .* differ(?s:.*)blocks.evict"),
    ("check_append_slots", take_from_the_back, r"block tables differ(?s:.*)front of the free list"),
    ("check_free", free_everything_to_the_front, r"free list, in eviction order .* differ"),
    ("check_free", free_ignoring_sharing, r"reference counts .* differ"),
    ("check_free", lambda blocks, seq: None, r"block_table is \[\d+(, \d+)*\]; expected \[\]"),
])
def test_checks_name_the_mistake(check, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        getattr(checks, check)(wrong)


@pytest.mark.slow
def test_engine_check_passes_the_solution_fails_a_stale_cache_and_restores_the_pool(solution, capsys):
    llm = LLM("tiny", block_size=4, num_kv_blocks=16, max_model_len=64)
    blocks = llm.llm_engine.block_manager
    checks.check_engine(solution["append_slots"], solution["free"], llm)
    assert "check_engine passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="with your append_slots in the engine"):
        checks.check_engine(take_without_evicting, solution["free"], llm)
    # The engine's own methods are back, and the wrong run's stale prefix entries are gone.
    assert blocks.append_slots.__func__ is BlockManager.append_slots and blocks.free.__func__ is BlockManager.free
    assert blocks.num_free_blocks == blocks.num_blocks and not blocks.cached_block_ids
    checks.check_engine(solution["append_slots"], solution["free"], llm)
