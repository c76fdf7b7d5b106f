"""Exercise 02's checks: they pass the solution, name common mistakes, refuse the untouched exercise,
and the engine check undoes whatever a wrong answer did to the engine's pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from minillm import LLM
from minillm.grading import checks_append_slots_and_free
from minillm.grading.block_manager_replay import reference_append_slots
from minillm.grading.checks_append_slots_and_free import check_append_slots, check_free
from minillm.grading.checks_block_manager_engine import check_engine
from minillm.grading.checks_prefix_lookup import check_allocate
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read
from minillm.kv.block_manager import BlockManager, hash_block

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "02_paged_kv_cache.ipynb"


@pytest.fixture(scope="module")
def solution() -> dict:
    namespace: dict = {"hash_block": hash_block}  # what the solution cells use from the notebook's imports
    for cell in filter(is_solution, read(SOLUTION).cells):
        if cell.cell_type == "code":
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


def allocate_with(mistake: str | None = None):
    """allocate as the solution does it, or with one typical mistake."""
    def allocate(blocks, seq):
        size, parent, hits, hashes = blocks.block_size, None, [], []
        walk = seq.num_tokens // size if mistake == "looks up the last token's block" else (seq.num_tokens - 1) // size
        for i in range(walk):
            tokens = tuple(seq.token_ids[i * size:(i + 1) * size])
            parent = hash_block(parent, tokens)
            block_id = blocks.cached_block_ids.get(parent)
            collision = block_id is not None and blocks.blocks[block_id].token_ids != tokens
            if block_id is None or (collision and mistake != "trusts the hash"):
                if mistake == "goes on after a miss":
                    continue
                break
            hits.append(block_id)
            hashes.append(parent)
        if mistake == "appends fresh blocks first":
            reference_append_slots(blocks, seq, seq.num_tokens - len(hits) * size)
        for block_id in hits:
            block = blocks.blocks[block_id]
            if block.ref_count == 0 and mistake != "leaves hits on the free list":
                del blocks.free_block_ids[block_id]
            block.ref_count += 2 if mistake == "counts a hit twice" else 1
        fresh = seq.block_table
        seq.block_table = hits + fresh
        seq.block_hashes = [] if mistake == "forgets block_hashes" else hashes
        seq.num_computed_tokens = len(hits) * (1 if mistake == "counts blocks, not tokens" else size)
        if mistake != "appends fresh blocks first":
            reference_append_slots(blocks, seq, seq.num_tokens)
        return len(hits) * size
    return allocate


def test_checks_pass_on_the_solution(solution, capsys):
    check_append_slots(solution["append_slots"])
    check_free(solution["free"])
    check_allocate(solution["allocate"])
    check_allocate(allocate_with(None))  # the template the mistakes below are made from is right
    out = capsys.readouterr().out
    assert "check_append_slots passed" in out and "check_free passed" in out and "check_allocate passed" in out


@pytest.mark.parametrize("check, wrong, message", [
    ("check_append_slots", take_without_evicting, r"prefix cache .* differ(?s:.*)blocks.evict"),
    ("check_append_slots", take_from_the_back, r"block tables differ(?s:.*)front of the free list"),
    ("check_free", free_everything_to_the_front, r"free list, in eviction order .* differ"),
    ("check_free", free_ignoring_sharing, r"reference counts .* differ"),
    ("check_free", lambda blocks, seq: None, r"block_table is \[\d+(, \d+)*\]; expected \[\]"),
])
def test_checks_name_the_mistake(check, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        getattr(checks_append_slots_and_free, check)(wrong)


@pytest.mark.parametrize("mistake, message", [
    # A hash match is not proof: the forged collision's block holds other tokens.
    ("trusts the hash", r"block tables differ(?s:.*)hash collision"),
    # After a miss, a later block's K/V were computed after other tokens: no reuse past the first miss.
    ("goes on after a miss", r"block tables differ(?s:.*)a miss, the lookup stops"),
    ("leaves hits on the free list", r"free list, in eviction order .* differ(?s:.*)leaves the free list"),
    ("counts a hit twice", r"reference counts .* differ(?s:.*)exactly one"),
    # The block holding the last prompt token must be computed: the step samples from its logits.
    ("looks up the last token's block", r"block tables differ(?s:.*)never looked up"),
    ("counts blocks, not tokens", r"num_computed_tokens of the sequences differ(?s:.*)tokens, not blocks"),
    ("forgets block_hashes", r"block_hashes of the sequences differ"),
    # Under pressure append_slots evicts from the front of the free list, where a hit may be waiting.
    ("appends fresh blocks first", r"block tables differ(?s:.*)a full pool"),
])
def test_check_allocate_names_the_mistake(mistake, message):
    with pytest.raises(CheckFailed, match=message):
        check_allocate(allocate_with(mistake))


def test_check_allocate_refuses_the_stub():
    def stub(blocks, seq):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="allocate is not implemented yet"):
        check_allocate(stub)


@pytest.mark.slow
def test_engine_check_passes_the_solution_fails_wrong_ones_and_restores_the_pool(solution, capsys):
    llm = LLM("tiny", dtype="float32", block_size=4, num_kv_blocks=16, max_model_len=64)
    blocks = llm.llm_engine.block_manager
    mine = solution["append_slots"], solution["free"]
    check_engine(*mine, solution["allocate"], llm)
    out = capsys.readouterr().out
    assert "check_engine passed" in out and " 0 prompt tokens came from the prefix cache" not in out
    with pytest.raises(CheckFailed, match="with your append_slots in the engine"):
        check_engine(take_without_evicting, solution["free"], solution["allocate"], llm)
    # The engine's own methods are back, and the wrong run's stale prefix entries are gone.
    assert blocks.append_slots.__func__ is BlockManager.append_slots and blocks.free.__func__ is BlockManager.free
    assert blocks.num_free_blocks == blocks.num_blocks and not blocks.cached_block_ids
    # A hit left on the free list is handed out again as a fresh block, and overwritten.
    with pytest.raises(CheckFailed, match="with your allocate in the engine, greedy generation differs"):
        check_engine(*mine, allocate_with("leaves hits on the free list"), llm)
    assert blocks.allocate.__func__ is BlockManager.allocate and not blocks.cached_block_ids
    with pytest.raises(CheckFailed, match="blocks are still held: each hit adds exactly one reference"):
        check_engine(*mine, allocate_with("counts a hit twice"), llm)

    def no_lookup(blocks, seq):  # right tokens, but nothing ever comes from the cache
        seq.block_table, seq.block_hashes, seq.num_computed_tokens = [], [], 0
        reference_append_slots(blocks, seq, seq.num_tokens)
        return 0

    with pytest.raises(CheckFailed, match="no prompt found a single block in the prefix cache"):
        check_engine(*mine, no_lookup, llm)
    check_engine(*mine, solution["allocate"], llm)
