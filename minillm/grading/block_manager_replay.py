"""How exercise 02's checks judge the learner's `append_slots`, `free` and `allocate`: the same
operations run through the reference and through the learner's function, on two managers built the
same way, and the whole state is compared after each one, so that a message can say which operation
went wrong and how.

The functions work on a live `BlockManager` (`blocks`): its `blocks[i].ref_count`, `block_hash` and
`token_ids`, its free list `free_block_ids` (an OrderedDict in eviction order: the first entry is
reused first), its prefix cache `cached_block_ids` (block hash -> block id) and `evict(block_id)`;
and on a sequence's `block_table`, `block_hashes` and `num_computed_tokens`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from minillm.grading.feedback import CheckFailed, call_learner
from minillm.kv.block_manager import BlockManager, hash_block
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence

BLOCK_SIZE = 4
POOL_BLOCKS = 10
SHARED = [7, 7, 1, 2, 3, 4, 5, 6]  # two full blocks that many test prompts start with


# The class's methods, not the instance's attributes: the checks put the learner's functions there.
def reference_append_slots(blocks: BlockManager, seq: Sequence, num_tokens: int) -> None:
    BlockManager.append_slots(blocks, seq, num_tokens)


def reference_free(blocks: BlockManager, seq: Sequence) -> None:
    BlockManager.free(blocks, seq)


def reference_allocate(blocks: BlockManager, seq: Sequence) -> int:
    return BlockManager.allocate(blocks, seq)


REFERENCE = (reference_allocate, reference_append_slots, reference_free)


def state(blocks: BlockManager, seqs: list[Sequence]) -> dict:
    return {"tables": {s.request_id: list(s.block_table) for s in seqs},
            "ref_counts": {b.block_id: b.ref_count for b in blocks.blocks if b.ref_count},
            "free": list(blocks.free_block_ids),
            "cached": dict(blocks.cached_block_ids),
            "computed": {s.request_id: s.num_computed_tokens for s in seqs},
            "hashes": {s.request_id: list(s.block_hashes) for s in seqs}}


WHAT = {"tables": "block tables", "ref_counts": "reference counts (blocks not listed: 0)",
        "free": "free list, in eviction order (first = reused first)",
        "cached": "prefix cache (block hash -> block id)",
        "computed": "num_computed_tokens of the sequences", "hashes": "block_hashes of the sequences"}

HINTS = {
    "tables": "a sequence needs ceil(num_tokens / block_size) blocks, taken one by one from the front of the "
              "free list and appended to its block table",
    "ref_counts": "taking a block adds one to its ref_count; freeing a sequence takes one off each block in its "
                  "table",
    "free": "a block leaves the free list when it is taken, and comes back when its ref_count reaches 0: at the "
            "back if it still holds a cached prefix (block_hash is not None), at the front otherwise; free a "
            "table from its last block to its first",
    "cached": "before reusing a free block, blocks.evict(block_id) forgets the prefix it held",
}

ALLOCATE_HINTS = {
    "tables": "the table starts with the blocks the prefix lookup found, in prompt order (compare what it "
              "should have found, below, with the start of your table), and goes on with fresh blocks from "
              "append_slots; take the hits first: append_slots hands out the front of the free list, which "
              "under pressure may be a cached block you meant to reuse",
    "ref_counts": "a hit adds exactly one to its block's ref_count, whether the block was free or already held "
                  "by another sequence (each sequence holding a block counts once)",
    "free": "a hit on a free block (ref_count 0) leaves the free list as surely as a fresh block does; a block "
            "another sequence holds is not on it. Take the hits before appending fresh blocks: append_slots "
            "evicts from the front of the free list, and under pressure that may be a block you meant to reuse",
    "cached": "allocate registers nothing: a block enters the prefix cache when the scheduler gives a step its "
              "tokens to compute (cache_full_blocks does that); and fresh blocks are evicted by append_slots",
    "computed": "the hit blocks' K/V are in the cache already, so they count as computed: num_computed_tokens "
                "counts their tokens (tokens, not blocks); the rest is still to compute",
    "hashes": "seq.block_hashes lists, in order, the hashes of the sequence's leading blocks that are in the "
              "prefix cache: after allocate, those of its hits (cache_full_blocks goes on with the chain from "
              "the last one)",
    "returned": "allocate returns how many prompt tokens were prefix-cache hits (the engine reports them as "
                "num_cached_tokens)",
}


def _explain(name: str, op: str, expected: dict, got: dict) -> str:
    hints = ALLOCATE_HINTS if name == "allocate" else HINTS
    for key in ("tables", "ref_counts", "free", "cached", "computed", "hashes", "returned"):
        if expected.get(key) != got.get(key):
            what = WHAT.get(key, "values it returned")
            return (f"after {op}, the {what} differ\n  expected: {expected[key]}\n  got:      {got[key]}\n"
                    f"  hint: {hints.get(key, HINTS.get(key, ''))}")
    return ""


def lookup_story(blocks: BlockManager, seq: Sequence) -> str:
    """What the reference's prefix lookup finds, block by block, told for a check's message."""
    size, parent, steps = blocks.block_size, None, []
    last = (seq.num_tokens - 1) // size
    for i in range(last):
        tokens = tuple(seq.token_ids[i * size:(i + 1) * size])
        parent = hash_block(parent, tokens)
        block_id = blocks.cached_block_ids.get(parent)
        if block_id is None:
            steps.append(f"prompt block {i}: its hash is not in the cache, a miss: the lookup stops")
            break
        block = blocks.blocks[block_id]
        if block.token_ids != tokens:
            steps.append(f"prompt block {i}: its hash is cached as block {block_id}, but that block holds "
                         f"{list(block.token_ids)}, not {list(tokens)} (a hash collision): a miss, the lookup stops")
            break
        steps.append(f"prompt block {i}: a hit, block {block_id} ({'free' if not block.ref_count else 'held'})")
    else:
        steps.append(f"prompt block {last} holds the last prompt token: it is never looked up (the step must "
                     "compute that token to sample the next one)")
    return "\n    ".join(steps)


def _sequence(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id, None, tokens, SamplingParams(max_tokens=64), 4096, frozenset(), None, 0.0)


def _forge_collision(blocks: BlockManager) -> str:
    """Make the first cached block (by id) hold other tokens than those its hash was made from, as if
    two different blocks had hashed the same. Returns what was done, for messages."""
    block = next((b for b in blocks.blocks if b.block_hash is not None), None)
    if block is None:
        return ""
    real = block.token_ids
    block.token_ids = tuple(t + 100 for t in real)
    return (f"a forged hash collision: block {block.block_id} stays cached under the hash of {list(real)} but "
            f"now holds {list(block.token_ids)}")


def replay(learner: tuple[Callable, Callable, Callable], name: str, ops: list[tuple], where: str) -> None:
    """The workload through two managers, the reference's and one driven by the learner's functions
    (allocate, append_slots, free). After each operation the whole state must be the same."""
    managers = [BlockManager(POOL_BLOCKS, BLOCK_SIZE), BlockManager(POOL_BLOCKS, BLOCK_SIZE)]
    live: list[list[Sequence]] = [[], []]
    sides = [REFERENCE, learner]
    for blocks, (_, do_append, _) in zip(managers, sides):
        # The engine's own call (from allocate) goes to the function under test, as in the engine.
        blocks.append_slots = functools.partial(adapt, do_append, blocks)
    for op in ops:
        described, story, returned = "", "", [None, None]
        computed: list[tuple[BlockManager, Sequence]] = []
        for side in (0, 1):
            blocks, seqs = managers[side], live[side]
            do_allocate, do_append, do_free = sides[side]
            if op[0] == "add":
                seq = _sequence(op[1], op[2])
                if not blocks.can_allocate(seq):
                    continue
                story = lookup_story(blocks, seq) if side == 0 else story
                described = f"allocate(blocks, {op[1]}) for a prompt of {len(op[2])} tokens {op[2]}"
                returned[side] = _call(side, name, described, do_allocate, blocks, seq)
                seqs.append(seq)
                computed.append((blocks, seq))
            elif op[0] == "grow" and seqs:
                seq = seqs[op[1] % len(seqs)]
                if not blocks.can_append(seq, seq.num_tokens + op[2]):
                    continue
                seq.token_ids += [0] * op[2]
                described = f"append_slots(blocks, {seq.request_id}, num_tokens={seq.num_tokens})"
                _call(side, name, described, do_append, blocks, seq, seq.num_tokens)
                computed.append((blocks, seq))
            elif op[0] == "free" and seqs:
                seq = seqs.pop(op[1] % len(seqs))
                described = f"free(blocks, {seq.request_id}) with block table {seq.block_table}"
                _call(side, name, described, do_free, blocks, seq)
                if seq.block_table:
                    raise CheckFailed(f"after {described}, {seq.request_id}'s block_table is "
                                      f"{seq.block_table}; expected [] (the sequence holds no block any more)")
            elif op[0] == "forge":
                described = _forge_collision(blocks)
        if described:
            expected, got = state(managers[0], live[0]), state(managers[1], live[1])
            expected["returned"], got["returned"] = returned
            problem = _explain(name, described, expected, got)
            if problem:
                lookup = f"\n  the reference's prefix lookup:\n    {story}" if story and name == "allocate" else ""
                raise CheckFailed(f"{name}: {problem}{lookup}\n  ({where}, pool of {POOL_BLOCKS} blocks of "
                                  f"{BLOCK_SIZE} tokens)")
        for blocks, seq in computed:  # the step that follows: every token computed, full blocks registered
            seq.num_computed_tokens = seq.num_tokens
            blocks.cache_full_blocks(seq)


def adapt(fn: Callable, blocks: BlockManager, seq: Sequence, num_tokens: int | None = None) -> None:
    """The engine's call `blocks.append_slots(seq[, num_tokens])`, in the exercise's signature."""
    fn(blocks, seq, seq.num_tokens if num_tokens is None else num_tokens)


def _call(side: int, name: str, described: str, fn: Callable, *args) -> object:
    if side == 0:
        return fn(*args)
    return call_learner(fn, name, described, *args)
