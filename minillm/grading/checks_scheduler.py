"""Checks for exercise 04, continuous batching: the learner's `admit(scheduler, batch, budget)`, the
scheduler's admission step, against the scheduler's own, on random workloads and then in the engine.

A check drives two schedulers in lockstep through the same workload (requests arriving over time, a
small KV pool that forces preemption, a small token budget that forces chunked prefill), one with
the reference `admit` and one with the learner's, hands both what a model would have produced
(`Scheduler.update`), and compares the batch and the queues after every step, so that a message can
say which step went wrong and which rule was broken.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from minillm.block_manager import BlockManager
from minillm.engine_config import SchedulerConfig
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.kv_cache_manager import PagedKVCacheManager
from minillm.llm import LLM
from minillm.runner_output import ModelRunnerOutput
from minillm.sampling_params import SamplingParams
from minillm.scheduler import ScheduledBatch, Scheduler
from minillm.sequence import Sequence

BLOCK_SIZE = 4
SEEDS = (0, 1, 2, 3, 4, 93)  # 93: a preempted victim would fit again at once, through its cached prefix
RULES = ("admit while the queue is not empty, the budget is above 0, nothing was preempted this step "
         "(batch.preempted is empty) and fewer than scheduler.max_num_seqs run; for the queue's head: "
         "scheduler.allocate(seq) (stop if False), popleft, append to scheduler.running, then "
         "budget -= batch.add(seq, scheduler.num_new_tokens(seq, budget))")


def _workload(seed: int) -> tuple[dict, list[tuple[int, list[int], int]]]:
    """Scheduler limits, and requests as (arrival step, prompt, max_tokens)."""
    rng = random.Random(seed)
    limits = {"max_num_seqs": rng.randint(2, 4), "max_num_batched_tokens": rng.choice([6, 10, 16]),
              "num_blocks": rng.randint(10, 16)}
    shared = [rng.randrange(50) for _ in range(12)]  # a common beginning: prefix-cache hits, shared blocks
    requests = [(rng.randrange(12), shared[:rng.randrange(13)] + [rng.randrange(50) for _ in range(rng.randint(1, 12))],
                 rng.randint(1, 12)) for _ in range(rng.randint(6, 10))]
    return limits, sorted(requests, key=lambda r: r[0])


def _state(scheduler: Scheduler, batch: ScheduledBatch) -> dict:
    return {"batch": [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)],
            "running": [s.request_id for s in scheduler.running],
            "waiting": [s.request_id for s in scheduler.waiting]}


def _explain(expected: dict, got: dict, scheduler: Scheduler, batch: ScheduledBatch) -> str:
    if batch.num_batched_tokens > scheduler.max_num_batched_tokens:
        hint = ("the batch holds more tokens than max_num_batched_tokens: a prompt gets at most the budget "
                "left, scheduler.num_new_tokens(seq, budget), and the budget shrinks by what each one takes")
    elif len(scheduler.running) > scheduler.max_num_seqs:
        hint = "more than max_num_seqs sequences run: stop admitting when len(scheduler.running) reaches it"
    elif batch.preempted and got["running"] != expected["running"]:
        hint = ("this step preempted a sequence, and then admitted requests: admit none when batch.preempted "
                "is not empty (memory is short, and the victim would come straight back through its cached "
                "prefix)")
    elif [r for r in got["running"] if r not in expected["running"]]:
        hint = ("a request was admitted ahead of its turn: when the head of the queue does not fit "
                "(allocate returns False), stop; a later, smaller request must not pass it")
    else:
        hint = RULES
    return f"  expected: {expected}\n  got:      {got}\n  hint: {hint}"


def _simulate(admit: Callable, seed: int) -> None:
    limits, requests = _workload(seed)
    schedulers = [Scheduler(SchedulerConfig(limits["max_num_seqs"], limits["max_num_batched_tokens"]),
                            PagedKVCacheManager(BlockManager(limits["num_blocks"], BLOCK_SIZE))) for _ in range(2)]
    learner = schedulers[1]
    learner.admit = lambda batch, budget: call_learner(admit, "admit", f"step {step}, budget {budget}", learner,
                                                       batch, budget)
    queues = [[(t, Sequence(f"r{i}", prompt_token_ids=prompt, params=SamplingParams(max_tokens=m)))
               for i, (t, prompt, m) in enumerate(requests)] for _ in range(2)]
    described = (f"workload seed {seed}: {len(requests)} requests, max_num_seqs={limits['max_num_seqs']}, "
                 f"max_num_batched_tokens={limits['max_num_batched_tokens']}, a pool of {limits['num_blocks']} "
                 f"blocks of {BLOCK_SIZE} tokens")
    for step in range(1000):
        states = []
        for scheduler, queue in zip(schedulers, queues):
            while queue and queue[0][0] <= step:
                scheduler.add_request(queue.pop(0)[1])
            batch = scheduler.schedule()
            states.append((_state(scheduler, batch), batch))
        (expected, _), (got, batch) = states
        if expected != got:
            raise CheckFailed(f"admit: after scheduling step {step}, the scheduler differs from the reference "
                              f"({described})\n{_explain(expected, got, learner, batch)}")
        if not any(s.has_unfinished_requests() for s in schedulers) and not queues[0]:
            return
        for scheduler, (_, batch) in zip(schedulers, states):
            # What a model would have produced: a token where one is due.
            scheduler.update(batch, ModelRunnerOutput([[len(seq.token_ids) % 7] if sample else []
                                                       for seq, sample in zip(batch.seqs, batch.do_sample)]))
    raise CheckFailed(f"admit: the workload did not finish in 1000 steps ({described})")


def check_admit(admit: Callable) -> None:
    """The learner's admission step against the reference on random workloads, step by step."""
    for seed in SEEDS:
        _simulate(admit, seed)
    print(f"check_admit passed: {len(SEEDS)} random workloads (arrivals over time, chunked prompts, preemption), "
          "every step the same batch and queues as the reference")


def check_engine(admit: Callable, llm: LLM) -> None:
    """Greedy generation with the learner's admission step scheduling the engine. Any schedule that
    keeps the rules gives the same tokens, so the limits are checked after every call too, and the
    pool must be whole again at the end."""
    engine = llm.llm_engine
    scheduler = engine.scheduler

    def within_limits(batch: ScheduledBatch, budget: int) -> None:
        admit(scheduler, batch, budget)
        if batch.num_batched_tokens > scheduler.max_num_batched_tokens:
            raise CheckFailed(f"with your admit in the engine, a step computes {batch.num_batched_tokens} tokens, "
                              f"more than max_num_batched_tokens={scheduler.max_num_batched_tokens}\n  hint: {RULES}")
        if len(scheduler.running) > scheduler.max_num_seqs:
            raise CheckFailed(f"with your admit in the engine, {len(scheduler.running)} sequences run, more than "
                              f"max_num_seqs={scheduler.max_num_seqs}\n  hint: {RULES}")

    done = check_generation(llm, scheduler, "admit", scheduler.admit, within_limits, "admit")
    blocks = engine.block_manager
    if blocks is not None and blocks.num_free_blocks != blocks.num_blocks:
        raise CheckFailed(f"after generating with your admit, {blocks.num_blocks - blocks.num_free_blocks} KV "
                          "blocks are still held: every admitted sequence must be in scheduler.running, where "
                          "the engine finishes it and frees its blocks")
    print(f"check_engine passed: with your admit scheduling every step, {done}, within the limits")
