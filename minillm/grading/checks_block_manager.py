"""Checks for exercise 02, the paged KV cache: the learner's `append_slots` and `free` against the
block manager's own, on random workloads, and then inside the real engine.

Both functions work on a live `BlockManager` (`blocks`): its `blocks[i].ref_count`, its free list
`free_block_ids` (an OrderedDict in eviction order: the first entry is reused first) and
`evict(block_id)`, and on a sequence's `block_table`. A check runs the same operations through the
reference and through the learner's function, on two managers built the same way, and compares
the whole state after each one, so that a message can say which operation went wrong and how.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from minillm.block_manager import BlockManager
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence

BLOCK_SIZE = 4
SHARED = [7, 7, 1, 2, 3, 4, 5, 6]  # two full blocks that many test prompts start with


# The class's methods, not the instance's attributes: the checks put the learner's functions there.
def reference_append_slots(blocks: BlockManager, seq: Sequence, num_tokens: int) -> None:
    BlockManager.append_slots(blocks, seq, num_tokens)


def reference_free(blocks: BlockManager, seq: Sequence) -> None:
    BlockManager.free(blocks, seq)


def state(blocks: BlockManager, seqs: list[Sequence]) -> dict:
    return {"tables": {s.request_id: list(s.block_table) for s in seqs},
            "ref_counts": {b.block_id: b.ref_count for b in blocks.blocks if b.ref_count},
            "free": list(blocks.free_block_ids),
            "cached": dict(blocks.cached_block_ids)}


def _sequence(request_id: str, tokens: list[int]) -> Sequence:
    return Sequence(request_id, None, tokens, SamplingParams(max_tokens=64), 4096, frozenset(), None, 0.0)


def _explain(op: str, expected: dict, got: dict) -> str:
    for key, what in (("tables", "block tables"), ("ref_counts", "reference counts (blocks not listed: 0)"),
                      ("free", "free list, in eviction order (first = reused first)"),
                      ("cached", "prefix cache (block hash -> block id)")):
        if expected[key] != got[key]:
            hint = {
                "tables": "a sequence needs ceil(num_tokens / block_size) blocks, taken one by one from the "
                          "front of the free list and appended to its block table",
                "ref_counts": "taking a block adds one to its ref_count; freeing a sequence takes one off each "
                              "block in its table",
                "free": "a block leaves the free list when it is taken, and comes back when its ref_count "
                        "reaches 0: at the back if it still holds a cached prefix (block_hash is not None), "
                        "at the front otherwise; free a table from its last block to its first",
                "cached": "before reusing a free block, blocks.evict(block_id) forgets the prefix it held",
            }[key]
            return (f"after {op}, the {what} differ\n  expected: {expected[key]}\n  got:      {got[key]}\n"
                    f"  hint: {hint}")
    return ""


def _workload(seed: int) -> list[tuple]:
    """Operations on a small pool: admit sequences (some sharing a cached prefix), grow them, free them."""
    rng = random.Random(seed)
    ops = []
    for i in range(12):
        kind = rng.choice(["add", "add", "grow", "free"])
        if kind == "add":
            tokens = (SHARED if rng.random() < 0.6 else []) + [rng.randrange(50) for _ in range(rng.randint(1, 7))]
            ops.append(("add", f"r{i}", tokens))
        else:
            ops.append((kind, rng.randrange(100), rng.randint(1, 6)))
    return ops


def _run(append_slots: Callable, free: Callable, name: str, seed: int) -> None:
    """The workload through two managers, the reference's and one driven by the learner's function."""
    managers = [BlockManager(10, BLOCK_SIZE), BlockManager(10, BLOCK_SIZE)]
    live: list[list[Sequence]] = [[], []]
    funcs = [(reference_append_slots, reference_free), (append_slots, free)]
    for blocks, (do_append, _) in zip(managers, funcs):
        # The engine's own call (from allocate) goes to the function under test, as in the engine.
        blocks.append_slots = functools.partial(_adapt, do_append, blocks)
    for op in _workload(seed):
        described = ""
        for side in (0, 1):
            blocks, seqs = managers[side], live[side]
            do_append, do_free = funcs[side]
            if op[0] == "add":
                seq = _sequence(op[1], op[2])
                if not blocks.can_allocate(seq):
                    continue
                described = (f"admitting {op[1]} with {len(op[2])} tokens (its blocks: prefix-cache hits first, "
                             f"then append_slots(blocks, seq, {len(op[2])}))")
                _call(side, name, described, blocks.allocate, seq)
                seqs.append(seq)
                seq.num_computed_tokens = seq.num_tokens
                blocks.cache_full_blocks(seq)
            elif op[0] == "grow" and seqs:
                seq = seqs[op[1] % len(seqs)]
                if not blocks.can_append(seq, seq.num_tokens + op[2]):
                    continue
                seq.token_ids += [0] * op[2]
                described = f"append_slots(blocks, {seq.request_id}, num_tokens={seq.num_tokens})"
                _call(side, name, described, do_append, blocks, seq, seq.num_tokens)
                seq.num_computed_tokens = seq.num_tokens
                blocks.cache_full_blocks(seq)
            elif op[0] == "free" and seqs:
                seq = seqs.pop(op[1] % len(seqs))
                described = f"free(blocks, {seq.request_id}) with block table {seq.block_table}"
                _call(side, name, described, do_free, blocks, seq)
                if seq.block_table:
                    raise CheckFailed(f"after {described}, {seq.request_id}'s block_table is "
                                      f"{seq.block_table}; expected [] (the sequence holds no block any more)")
        if described:
            problem = _explain(described, state(managers[0], live[0]), state(managers[1], live[1]))
            if problem:
                raise CheckFailed(f"{name}: {problem}\n  (workload seed {seed}, pool of 10 blocks of "
                                  f"{BLOCK_SIZE} tokens)")


def _adapt(fn: Callable, blocks: BlockManager, seq: Sequence, num_tokens: int | None = None) -> None:
    """The engine's call `blocks.append_slots(seq[, num_tokens])`, in the exercise's signature."""
    fn(blocks, seq, seq.num_tokens if num_tokens is None else num_tokens)


def _call(side: int, name: str, described: str, fn: Callable, *args) -> None:
    if side == 0:
        fn(*args)
    else:
        call_learner(fn, name, described, *args)


def check_append_slots(append_slots: Callable) -> None:
    """Blocks taken from the front of the free list, evicted, counted, appended to the table."""
    for seed in range(4):
        _run(append_slots, reference_free, "append_slots", seed)
    print("check_append_slots passed: 4 random workloads of admissions, growth and frees")


def check_free(free: Callable) -> None:
    """Reference counts down; blocks at zero back on the free list, cached ones at the back."""
    for seed in range(4, 8):
        _run(reference_append_slots, free, "free", seed)
    print("check_free passed: 4 random workloads of admissions, growth and frees")


def check_engine(append_slots: Callable, free: Callable, llm: LLM) -> None:
    """Greedy generation with the learner's functions managing the engine's KV blocks. The pool must
    be small enough that sequences are preempted and prefix blocks are shared and evicted."""
    blocks = llm.llm_engine.block_manager
    if blocks is None:
        raise CheckFailed("this check plugs your functions into the paged KV cache, but the LLM has "
                          f"kv_cache={llm.llm_engine.model_runner.attn_backend.name!r}: create it with the default "
                          "kv_cache='paged'")
    done = []
    try:
        for name, reference, learner in (
                ("append_slots", blocks.append_slots, functools.partial(_adapt, append_slots, blocks)),
                ("free", blocks.free, functools.partial(free, blocks))):
            blocks.reset()  # whatever an earlier run left cached, both runs start from the same pool
            done.append(check_generation(llm, blocks, name, reference, learner, name))
            if blocks.num_free_blocks != blocks.num_blocks:
                raise CheckFailed(f"after generating with your {name}, {blocks.num_blocks - blocks.num_free_blocks} "
                                  "blocks are still held: every block whose ref_count reaches 0 must go back to "
                                  "the free list")
    finally:
        blocks.reset()  # a wrong function must not leave the engine's pool corrupted
    print(f"check_engine passed: with your append_slots, then your free, in the engine, {done[0]}")

