"""Checks for exercise 02, parts 1 and 2: the learner's `append_slots` and `free` against the block
manager's own, on random workloads of admissions, growth and frees, replayed through both
(block_manager_replay compares the whole state after each operation).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from minillm.grading.block_manager_replay import (
    SHARED,
    reference_allocate,
    reference_append_slots,
    reference_free,
    replay,
)


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


def check_append_slots(append_slots: Callable) -> None:
    """Blocks taken from the front of the free list, evicted, counted, appended to the table."""
    for seed in range(4):
        replay((reference_allocate, append_slots, reference_free), "append_slots", _workload(seed),
               f"workload seed {seed}")
    print("check_append_slots passed: 4 random workloads of admissions, growth and frees")


def check_free(free: Callable) -> None:
    """Reference counts down; blocks at zero back on the free list, cached ones at the back."""
    for seed in range(4, 8):
        replay((reference_allocate, reference_append_slots, free), "free", _workload(seed), f"workload seed {seed}")
    print("check_free passed: 4 random workloads of admissions, growth and frees")
