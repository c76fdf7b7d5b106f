"""The random workloads exercise 04's checks drive a scheduler through, without a model: requests
arriving over time, a small KV pool that forces preemption, a small token budget that forces chunked
prefill, and after every step what a model would have produced, handled as the engine's step
handles it (the output processor appends the tokens and decides the stops, the scheduler updates).
"""

from __future__ import annotations

import random

from minillm.config.engine import SchedulerConfig
from minillm.engine.output_processor import OutputProcessor
from minillm.engine.policy import SchedulingPolicy
from minillm.engine.runner_output import ModelRunnerOutput
from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.kv.block_manager import BlockManager
from minillm.kv.cache_manager import PagedKVCacheManager
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence

BLOCK_SIZE = 4
# 93: the head of the queue does not fit while a request behind it would; 11056: a preempted victim would
# fit again at once, through a prefix it shares with a request still running (rare since a step's prompt
# blocks are shared within the step: it took 17,000 seeds to find one).
SEEDS = (0, 1, 2, 3, 4, 93, 11056)
Request = tuple[int, list[int], int]  # (arrival step, prompt, max_tokens)


def random_workload(seed: int) -> tuple[dict, list[Request]]:
    """Scheduler limits, and requests in arrival order."""
    rng = random.Random(seed)
    limits = {"max_num_seqs": rng.randint(2, 4), "max_num_batched_tokens": rng.choice([6, 10, 16]),
              "num_blocks": rng.randint(10, 16)}
    shared = [rng.randrange(50) for _ in range(12)]  # a common beginning: prefix-cache hits, shared blocks
    requests = [(rng.randrange(12), shared[:rng.randrange(13)] + [rng.randrange(50) for _ in range(rng.randint(1, 12))],
                 rng.randint(1, 12)) for _ in range(rng.randint(6, 10))]
    return limits, sorted(requests, key=lambda r: r[0])


def paged_scheduler(limits: dict, policy: str | SchedulingPolicy = "fcfs") -> Scheduler:
    config = SchedulerConfig(limits["max_num_seqs"], limits["max_num_batched_tokens"], scheduling_policy=policy)
    return Scheduler(config, PagedKVCacheManager(BlockManager(limits["num_blocks"], BLOCK_SIZE)))


def arrivals(requests: list[Request]) -> list[tuple[int, Sequence]]:
    """(arrival step, sequence) of each request, r0, r1, ..., in arrival order."""
    return [(t, Sequence(f"r{i}", prompt_token_ids=prompt, params=SamplingParams(max_tokens=m)))
            for i, (t, prompt, m) in enumerate(requests)]


def describe(seed: int, limits: dict, requests: list[Request]) -> str:
    return (f"workload seed {seed}: {len(requests)} requests, max_num_seqs={limits['max_num_seqs']}, "
            f"max_num_batched_tokens={limits['max_num_batched_tokens']}, a pool of {limits['num_blocks']} "
            f"blocks of {BLOCK_SIZE} tokens")


def finish_step(scheduler: Scheduler, batch: ScheduledBatch) -> None:
    """The rest of the step once the batch is scheduled, with what a model would have produced: a
    token where one is due."""
    output = ModelRunnerOutput([[len(seq.token_ids) % 7] if sample else []
                                for seq, sample in zip(batch.seqs, batch.do_sample)])
    OutputProcessor(None).process_outputs(batch.seqs, output)
    scheduler.update(batch, output)
