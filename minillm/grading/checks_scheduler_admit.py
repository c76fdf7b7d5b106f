"""Exercise 04, part 1: the learner's admission step, `admit(scheduler, batch, budget)`, first come,
first served, which the scheduler calls once per step to move waiting requests into the batch.

`check_admit` drives two schedulers in lockstep through the same random workloads, one with the
reference's scheduling policy and one with the learner's `admit` as its policy's, and compares the
batch and the queues after every step, so that a message can say which step went wrong and which
rule was broken.
"""

from __future__ import annotations

from collections.abc import Callable

from minillm.engine.policy import SchedulingPolicy
from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.grading import checks_scheduler_workloads as workloads
from minillm.grading.feedback import CheckFailed, call_learner

RULES = ("a request joins only while the step has budget left, fewer than max_num_seqs run and this step "
         "preempted nobody; it needs KV memory first (scheduler.allocate), and when the oldest waiting "
         "request gets none, nobody behind it joins either; a request that joins leaves waiting, goes to the "
         "end of running and into the batch, computing what the budget left allows (a chunk of a long prompt)")


def _state(scheduler: Scheduler, batch: ScheduledBatch) -> dict:
    return {"batch": [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)],
            "running": [s.request_id for s in scheduler.running],
            "waiting": [s.request_id for s in scheduler.waiting]}


def _explain(expected: dict, got: dict, scheduler: Scheduler, batch: ScheduledBatch) -> str:
    if batch.num_batched_tokens > scheduler.max_num_batched_tokens:
        hint = ("the batch holds more tokens than max_num_batched_tokens: a prompt gets at most the budget "
                "left (scheduler.num_new_tokens(seq, budget) says how much), and whatever a request takes is "
                "no longer left for the next one")
    elif any(n == 0 for _, n in got["batch"]):
        hint = ("a request joined the batch with 0 tokens to compute: the budget was spent before its turn, and it "
                "now holds KV memory and a slot in running for nothing; admit only while budget > 0")
    elif len(scheduler.running) > scheduler.max_num_seqs:
        hint = "more than max_num_seqs sequences run: count the running ones before each admission"
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
    limits, requests = workloads.random_workload(seed)

    def learners(scheduler: Scheduler, batch: ScheduledBatch, budget: int) -> None:
        call_learner(admit, "admit", f"step {step}, budget {budget}", scheduler, batch, budget)

    schedulers = [workloads.paged_scheduler(limits),
                  workloads.paged_scheduler(limits, SchedulingPolicy(admit=learners))]
    learner = schedulers[1]
    queues = [workloads.arrivals(requests) for _ in range(2)]
    described = workloads.describe(seed, limits, requests)
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
            workloads.finish_step(scheduler, batch)
    raise CheckFailed(f"admit: the workload did not finish in 1000 steps ({described})")


def check_admit(admit: Callable) -> None:
    """The learner's admission step against the reference on random workloads, step by step."""
    for seed in workloads.SEEDS:
        _simulate(admit, seed)
    print(f"check_admit passed: {len(workloads.SEEDS)} random workloads (arrivals over time, chunked prompts, "
          "preemption), every step the same batch and queues as the reference")
