"""Exercise 04, parts 2 and 3: the learner's admission steps scheduling the real engine, `admit`
(first come, first served) and their own policy. Either is handed to the engine as the `admit` of
its scheduling policy (the engine argument `scheduling_policy`). Any schedule that keeps the rules
gives the same greedy tokens, so the generation is compared with the engine's own admission step,
the limits are checked after every call, and the KV pool must be whole again at the end.
"""

from __future__ import annotations

from collections.abc import Callable

from minillm.engine.policy import SchedulingPolicy
from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.grading.checks_scheduler_admit import RULES
from minillm.grading.checks_scheduler_policy import POLICY, POLICY_RULES
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed
from minillm.llm import LLM

# Room for 2 sequences at once, 16 tokens per step and a pool of 5 blocks of 16 tokens: prompts are
# chunked, requests queue, and sequences are preempted and recomputed.
ENGINE = {"dtype": "float32", "max_model_len": 64, "max_num_seqs": 2, "max_num_batched_tokens": 16,
          "num_kv_blocks": 5}


def _check_in_engine(fn: Callable, model: str, device: str | None, name: str, rules: str) -> str:
    """Greedy generation with fn admitting requests in an engine of ENGINE's limits, the limits checked
    after every call; the pool must be whole again at the end. Returns what was compared."""
    policy = SchedulingPolicy()  # check_generation gives it the reference's admit, then fn
    llm = LLM(model, device=device, **ENGINE, scheduling_policy=policy)

    def within_limits(scheduler: Scheduler, batch: ScheduledBatch, budget: int) -> None:
        fn(scheduler, batch, budget)
        if batch.num_batched_tokens > scheduler.max_num_batched_tokens:
            raise CheckFailed(f"with your {name} in the engine, a step computes {batch.num_batched_tokens} tokens, "
                              f"more than max_num_batched_tokens={scheduler.max_num_batched_tokens}\n  hint: {rules}")
        if len(scheduler.running) > scheduler.max_num_seqs:
            raise CheckFailed(f"with your {name} in the engine, {len(scheduler.running)} sequences run, more than "
                              f"max_num_seqs={scheduler.max_num_seqs}\n  hint: {rules}")

    done = check_generation(llm, policy, "admit", policy.admit, within_limits, name)
    blocks = llm.llm_engine.block_manager
    if blocks is not None and blocks.num_free_blocks != blocks.num_blocks:
        raise CheckFailed(f"after generating with your {name}, {blocks.num_blocks - blocks.num_free_blocks} KV "
                          "blocks are still held: every admitted sequence must be in scheduler.running, where "
                          "the engine finishes it and frees its blocks")
    return done


def check_engine(admit: Callable, model: str = "tiny", device: str | None = None) -> None:
    """Greedy generation with the learner's admission step scheduling the engine."""
    done = _check_in_engine(admit, model, device, "admit", RULES)
    print(f"check_engine passed: with your admit scheduling every step, {done}, within the limits")


def check_policy_engine(policy: Callable, model: str = "tiny", device: str | None = None) -> None:
    """Greedy generation with the learner's policy scheduling the engine: the same tokens as with the
    engine's own admission step (a policy changes when a request runs, never what it generates)."""
    done = _check_in_engine(policy, model, device, POLICY, POLICY_RULES)
    print(f"check_policy_engine passed: with your {POLICY} scheduling every step, {done}, and no KV block was "
          "left held")
