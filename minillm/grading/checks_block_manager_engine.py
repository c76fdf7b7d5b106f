"""Checks for exercise 02, part 4: the learner's `append_slots`, `free` and `allocate` managing the
real engine's KV blocks, each alone and then all three.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from minillm.grading.block_manager_replay import adapt
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed
from minillm.kv.block_manager import BlockManager
from minillm.llm import LLM
from minillm.sequence import Sequence


@contextmanager
def _plugged(blocks: BlockManager, **functions: Callable) -> Iterator[None]:
    """The block manager's methods replaced by the given functions, restored on the way out."""
    previous = {name: getattr(blocks, name) for name in functions}
    for name, fn in functions.items():
        setattr(blocks, name, fn)
    try:
        yield
    finally:
        for name, fn in previous.items():
            setattr(blocks, name, fn)


def _all_returned(blocks: BlockManager, name: str) -> None:
    if blocks.num_free_blocks != blocks.num_blocks:
        why = ("each hit adds exactly one reference, which free takes off again: a block counted twice is never "
               "given back" if "allocate" in name else
               "every block whose ref_count reaches 0 must go back to the free list")
        raise CheckFailed(f"after generating with your {name}, {blocks.num_blocks - blocks.num_free_blocks} "
                          f"blocks are still held: {why}")


def check_engine(append_slots: Callable, free: Callable, allocate: Callable, llm: LLM) -> None:
    """Greedy generation with the learner's functions managing the engine's KV blocks: each alone, then
    all three. The pool must be small enough that sequences are preempted and prefix blocks are shared
    and evicted; the run with the learner's allocate starts from the prefix cache the reference's run
    left, and must hit it."""
    blocks = llm.llm_engine.block_manager
    if blocks is None:
        raise CheckFailed("this check plugs your functions into the paged KV cache, but the LLM has "
                          f"kv_cache={llm.llm_engine.model_runner.attn_backend.name!r}: create it with the default "
                          "kv_cache='paged'")
    if not blocks.enable_prefix_caching:
        raise CheckFailed("this check needs the prefix cache: create the LLM with enable_prefix_caching=True "
                          "(the default)")
    mine = {"append_slots": functools.partial(adapt, append_slots, blocks),
            "free": functools.partial(free, blocks)}
    hits: list[int] = []

    def counted_allocate(seq: Sequence) -> int:
        hit_tokens = allocate(blocks, seq)
        hits.append(hit_tokens if isinstance(hit_tokens, int) else 0)
        return hit_tokens

    done = []
    try:
        for name, learner in mine.items():
            blocks.reset()  # whatever an earlier run left cached, both runs start from the same pool
            done.append(check_generation(llm, blocks, name, getattr(blocks, name), learner, name))
            _all_returned(blocks, name)
        blocks.reset()
        # Your append_slots and free (each checked alone above) in both runs; the second one is yours.
        with _plugged(blocks, **mine):
            done.append(check_generation(llm, blocks, "allocate", blocks.allocate, counted_allocate, "allocate"))
        _all_returned(blocks, "allocate, append_slots and free")
        if not sum(hits):
            raise CheckFailed("with your allocate in the engine, the tokens are right, but no prompt found a "
                              "single block in the prefix cache, although the reference's run of the same prompts "
                              "had just left their blocks there: the lookup must find and reuse them")
    finally:
        blocks.reset()  # a wrong function must not leave the engine's pool corrupted
    print(f"check_engine passed: your append_slots, then your free, then your allocate with both, in the engine: "
          f"{done[0]}; {sum(hits)} prompt tokens came from the prefix cache in the run with your allocate")
