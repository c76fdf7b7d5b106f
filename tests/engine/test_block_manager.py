"""The block manager alone: allocation, reference counts, prefix caching and eviction, and
hypothesis-driven random workloads that check its invariants after every operation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.kv import block_manager as bm_module
from minillm.kv.block_manager import BlockManager
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence


def make_seq(request_id: str, token_ids: list[int]) -> Sequence:
    return Sequence(request_id, None, token_ids, SamplingParams(max_tokens=8), 4096, frozenset(), None, 0.0)


def check_invariants(bm: BlockManager, live: list[Sequence]) -> None:
    refs = [0] * bm.num_blocks
    for seq in live:
        assert len(seq.block_table) == bm.blocks_needed(seq.num_tokens), seq
        for block_id in seq.block_table:
            refs[block_id] += 1
    for block in bm.blocks:
        assert block.ref_count == refs[block.block_id], block  # ref counts match the block tables
        assert (block.block_id in bm.free_block_ids) == (block.ref_count == 0), block  # never free and held
    for block_hash, block_id in bm.cached_block_ids.items():
        assert bm.blocks[block_id].block_hash == block_hash


def compute(bm: BlockManager, seq: Sequence) -> None:
    """What a step does to the cache's bookkeeping: the sequence's tokens are now computed."""
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


def test_blocks_follow_length_and_return_on_free():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", list(range(6)))
    assert bm.can_allocate(seq)
    assert bm.allocate(seq) == 0 and len(seq.block_table) == 2 and bm.num_free_blocks == 6
    compute(bm, seq)
    seq.token_ids += [6, 7, 8]  # 9 tokens need a third block
    assert bm.can_append(seq)
    bm.append_slots(seq)
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(seq)
    assert bm.num_free_blocks == 8 and seq.block_table == []


def test_blocks_registered_as_scheduled_are_hits_at_once_and_forgotten_if_never_computed():
    """The scheduler registers the blocks a step is to compute: a sequence allocated after that finds
    them at once. If the step never runs, only the blocks no step computed leave the cache."""
    bm = BlockManager(num_blocks=16, block_size=4)
    first = make_seq("a", list(range(13)))
    bm.allocate(first)
    first.num_computed_tokens = 4  # a step before computed the first block
    bm.cache_full_blocks(first)
    bm.cache_full_blocks(first, 12)  # this step is to compute up to token 12: blocks 2 and 3 too
    assert bm.num_cached_blocks == 3 and first.num_computed_tokens == 4
    second = make_seq("b", list(range(12)) + [99])
    assert bm.allocate(second) == 12 and second.block_table[:3] == first.block_table[:3]
    bm.forget_uncomputed(first)  # the step failed
    assert list(bm.cached_block_ids.values()) == [first.block_table[0]] and first.block_hashes == \
        [bm.blocks[first.block_table[0]].block_hash]
    bm.free(second)
    third = make_seq("c", list(range(12)) + [99])
    assert bm.allocate(third) == 4  # the computed block only


def test_prefix_hit_shares_blocks_and_recomputes_the_last_token():
    bm = BlockManager(num_blocks=16, block_size=4)
    first = make_seq("a", list(range(10)))
    bm.allocate(first)
    compute(bm, first)  # two full blocks registered
    second = make_seq("b", list(range(10)) + [99])
    assert bm.allocate(second) == 8
    assert second.block_table[:2] == first.block_table[:2] and second.num_computed_tokens == 8
    assert bm.blocks[first.block_table[0]].ref_count == 2
    # A prompt made only of cached blocks still leaves its last block to compute.
    exact = make_seq("c", list(range(8)))
    assert bm.allocate(exact) == 4 and exact.num_computed_tokens == 4
    check_invariants(bm, [first, second, exact])


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    first = make_seq("a", list(range(10)))
    bm.allocate(first)
    compute(bm, first)
    assert bm.allocate(make_seq("b", list(range(10)))) == 0 and bm.num_cached_blocks == 0


def test_freed_prefix_survives_until_evicted_least_recently_used_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    old, new = make_seq("old", [1, 2, 3]), make_seq("new", [5, 6, 7])
    for seq in (old, new):
        bm.allocate(seq)
        compute(bm, seq)
        bm.free(seq)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    filler = make_seq("filler", [9, 9, 9])  # two blocks: the two without a cached prefix are taken first
    bm.allocate(filler)
    assert bm.num_cached_blocks == 2
    bm.allocate(make_seq("x", [8, 8, 8]))  # needs two more: the older prefix is evicted, then the newer
    assert bm.num_cached_blocks == 0
    bm.free(filler)
    again = make_seq("again", [5, 6, 7])
    assert bm.allocate(again) == 0


def test_least_recently_freed_prefix_is_evicted_first():
    bm = BlockManager(num_blocks=3, block_size=2)
    for tokens in ([1, 2, 0], [3, 4, 0]):
        seq = make_seq(str(tokens), tokens)
        bm.allocate(seq)
        compute(bm, seq)
        bm.free(seq)
    bm.allocate(make_seq("y", [7, 7]))  # the block with nothing cached, then the older prefix [1, 2]
    bm.allocate(make_seq("z", [8, 8]))
    assert len(bm.match_prefix(make_seq("new", [3, 4, 1]))) == 1
    assert bm.match_prefix(make_seq("old", [1, 2, 1])) == []


def test_hash_collision_is_caught_by_comparing_tokens(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, tokens: 42)
    bm = BlockManager(num_blocks=8, block_size=2)
    first = make_seq("a", [1, 2, 3])
    bm.allocate(first)
    compute(bm, first)
    assert bm.allocate(make_seq("b", [5, 6, 7])) == 0  # same (fake) hash, different tokens: a miss


def test_allocation_refuses_when_pool_is_short():
    bm = BlockManager(num_blocks=2, block_size=4)
    assert not bm.can_allocate(make_seq("a", list(range(9))))
    with pytest.raises(RuntimeError, match="not enough free KV blocks"):
        bm.allocate(make_seq("a", list(range(9))))
    assert bm.num_free_blocks == 2


# A random workload over a small vocabulary and a few shared prefixes, so that hits, shared
# blocks, evictions and refusals all happen; invariants are checked after every operation.
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9], [5, 5, 5, 5, 5]]
operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.lists(st.integers(0, 3), max_size=12)),
    st.tuples(st.just("grow"), st.integers(0, 20), st.integers(1, 5)),
    st.tuples(st.just("finish"), st.integers(0, 20)),
    st.tuples(st.just("abort"), st.integers(0, 20)),
)


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(4, 24), block_size=st.sampled_from([1, 2, 4]), caching=st.booleans(),
       ops=st.lists(operation, max_size=40))
def test_random_workload_keeps_invariants_and_leaks_nothing(num_blocks, block_size, caching, ops):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    live: list[Sequence] = []
    for n, op in enumerate(ops):
        if op[0] == "add":
            seq = make_seq(f"r{n}", PREFIXES[op[1]] + op[2])
            if bm.can_allocate(seq):
                hit = bm.allocate(seq)
                assert hit % block_size == 0 and hit < seq.num_tokens
                live.append(seq)
                compute(bm, seq)
            else:
                with pytest.raises(RuntimeError):
                    bm.allocate(seq)
        elif live and op[0] == "grow":
            seq = live[op[1] % len(live)]
            if bm.can_append(seq, seq.num_tokens + op[2]):
                seq.token_ids += [0] * op[2]
                bm.append_slots(seq)
                compute(bm, seq)
        elif live:  # finish and abort both hand every block back
            bm.free(live.pop(op[1] % len(live)))
        check_invariants(bm, live)
    for seq in live:
        bm.free(seq)
    check_invariants(bm, [])
    assert bm.num_free_blocks == num_blocks


def test_the_last_free_block_can_be_appended():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq("a", list(range(4)))
    bm.allocate(seq)
    assert bm.can_append(seq, 8) and not bm.can_append(seq, 9)
    bm.append_slots(seq, 8)
    assert bm.num_free_blocks == 0


def test_a_freed_sequence_is_evicted_from_its_tail_so_its_beginning_stays_cached():
    """The beginning of a prefix is what other prompts share: under pressure the pool takes the
    blocks of its end first."""
    bm = BlockManager(num_blocks=3, block_size=2)
    seq = make_seq("a", [1, 2, 3, 4, 5])
    bm.allocate(seq)
    compute(bm, seq)  # blocks [1, 2] and [3, 4] cached
    bm.free(seq)
    bm.allocate(make_seq("x", [9]))  # the block with nothing cached goes first
    bm.allocate(make_seq("y", [8]))  # then the end of the prefix
    assert bm.num_cached_blocks == 1 and len(bm.match_prefix(make_seq("b", [1, 2, 3, 4, 6]))) == 1
