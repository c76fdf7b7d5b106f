"""Checks for exercise 02, part 3: the learner's `allocate`, with its prefix-cache lookup, against the
block manager's own, on fixed workloads that each aim at one part of the lookup (a shared prefix, a
forged hash collision, prompts that end on a block boundary, a full pool) and on random ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from minillm.grading.block_manager_replay import SHARED, reference_append_slots, reference_free, replay

LONG = [*SHARED, 8, 9, 10, 11]  # three full blocks


def _allocate_workload(seed: int) -> list[tuple]:
    """Like the random workloads of parts 1 and 2, with longer shared prefixes, prompts that end on a
    block boundary, and now and then a forged hash collision."""
    rng = random.Random(seed)
    ops = []
    for i in range(16):
        kind = rng.choice(["add", "add", "add", "grow", "free", "free", "forge"])
        if kind == "add":
            prefix = rng.choice([[], SHARED, LONG, LONG[:4]])
            ops.append(("add", f"r{i}", prefix + [rng.randrange(50) for _ in range(rng.randint(0, 6))] or [1]))
        else:
            ops.append((kind, rng.randrange(100), rng.randint(1, 6)))
    return ops


def _allocate_scenarios() -> list[tuple[str, list[tuple]]]:
    """Fixed workloads, each one aimed at one part of the lookup; then random ones."""
    other = list(range(20, 52))
    return [
        ("a shared prefix, held then free", [
            ("add", "a", [*LONG, 20, 21]), ("add", "b", [*LONG, 30]), ("free", 0, 0), ("free", 0, 0),
            ("add", "c", [*SHARED, 40, 41, 42])]),
        ("a forged hash collision on the first block of a cached prefix", [
            ("add", "x", [*LONG, 50]), ("free", 0, 0), ("forge", 0, 0), ("add", "y", [*LONG, 51])]),
        ("prompts that end on a block boundary", [
            ("add", "p", list(SHARED)), ("free", 0, 0), ("add", "q", list(SHARED)), ("add", "r", list(LONG))]),
        ("a full pool, where fresh blocks evict cached ones", [
            ("add", "a", [*LONG, 60]), ("free", 0, 0), ("add", "b", [*range(60, 72), 72]), ("free", 0, 0),
            ("add", "c", SHARED + other)]),
        *((f"random workload {seed}", _allocate_workload(seed)) for seed in range(8, 14)),
    ]


def check_allocate(allocate: Callable) -> None:
    """The prefix lookup (hash chain, tokens verified, first miss ends it), hits taken, fresh blocks
    appended, num_computed_tokens and block_hashes set, hit tokens returned."""
    scenarios = _allocate_scenarios()
    for label, ops in scenarios:
        replay((allocate, reference_append_slots, reference_free), "allocate", ops, label)
    print(f"check_allocate passed: {len(scenarios)} workloads (shared prefixes, a forged hash collision, prompts "
          "on a block boundary, a full pool, random ones)")
