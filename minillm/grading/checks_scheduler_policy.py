"""Exercise 04, part 3: the learner's own admission policy, `admit_shortest_first(scheduler, batch,
budget)`, shortest prompt first, with aging.

A policy has no reference to compare with, so `check_policy` asks it about hand-made queues (who
goes first), then runs it as a scheduler's policy through the random workloads of part 1 and checks
the rules every admission step keeps, whichever requests it chose.
"""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

from minillm.engine.policy import SchedulingPolicy
from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.grading import checks_scheduler_workloads as workloads
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence, SequenceStatus

POLICY = "admit_shortest_first"
POLICY_RULES = ("choose among the waiting requests, never among the running ones; keep every rule of admit "
                "(budget, max_num_seqs, no admission in a step that preempted, memory before anything else, and "
                "when the request you chose gets no memory, stop); among requests that arrived together the "
                "shortest prompt goes first, and a request that has waited long enough (scheduler.steps_waited) "
                "goes before newer ones")


def call_policy(policy: Callable, scheduler: Scheduler, batch: ScheduledBatch, budget: int,
                case: str) -> list[tuple[str, bool]]:
    """The learner's policy, called as the scheduler calls it; case: where, for the message. Returns
    whom it asked the KV cache for memory, in order: (request id, whether it fits). Asked at the cache,
    so that a policy that tries scheduler.allocate and one that looks first (can_allocate) are seen alike."""
    cache = scheduler.kv_cache_manager
    allocations: list[tuple[str, bool]] = []

    def can_allocate(seq: Sequence) -> bool:
        fits = type(cache).can_allocate(cache, seq)
        allocations.append((seq.request_id, fits))
        return fits

    try:
        with mock.patch.object(cache, "can_allocate", can_allocate):
            call_learner(policy, POLICY, case, scheduler, batch, budget)
    except CheckFailed as e:
        if "mutated during iteration" not in str(e):
            raise
        raise CheckFailed(f"{e}\n  hint: you removed a request from scheduler.waiting while a for loop was walking "
                          "through it; walk through a copy (sorted() returns a new list) or choose one request per "
                          "round of a while loop") from None
    return allocations


def _queue(lengths: list[int], waited: list[int], max_num_seqs: int) -> Scheduler:
    """A scheduler with nothing running and requests r0, r1, ... waiting, of the given prompt lengths,
    each having waited the given number of steps."""
    limits = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 64, "num_blocks": 64}
    scheduler = workloads.paged_scheduler(limits)
    for i in sorted(range(len(lengths)), key=lambda i: -waited[i]):  # arrival order: the oldest first
        scheduler.num_steps = max(waited) - waited[i]
        scheduler.add_request(Sequence(f"r{i}", prompt_token_ids=[i % 7] * lengths[i],
                                       params=SamplingParams(max_tokens=4)))
    scheduler.num_steps = max(waited)
    return scheduler


def _order_case(policy: Callable, title: str, lengths: list[int], waited: list[int], max_num_seqs: int,
                expected: list[str], mistakes: dict[tuple[str, ...], str]) -> None:
    scheduler = _queue(lengths, waited, max_num_seqs)
    case = ", ".join(f"r{i}: {n} tokens, waited {w} steps" for i, (n, w) in enumerate(zip(lengths, waited)))
    room = f"room for {max_num_seqs} sequence{'s' if max_num_seqs > 1 else ''}"
    batch = ScheduledBatch([], [], [], [])
    where = f"on the queue '{title}' ({case}), with {room}"
    before = (list(scheduler.running), list(scheduler.waiting), 0)
    _check_step(scheduler, batch, before, call_policy(policy, scheduler, batch, 64, where), where)
    got = [s.request_id for s in batch.seqs]
    if got != expected:
        hint = mistakes.get(tuple(got), POLICY_RULES)
        raise CheckFailed(f"{POLICY} {where}: "
                          f"admitted {got}, expected {expected}\n  hint: {hint}")


def _check_step(scheduler: Scheduler, batch: ScheduledBatch, before: tuple[list, list, int],
                allocations: list[tuple[str, bool]], where: str) -> None:
    """The rules one admission step keeps, whichever requests it chose (allocations: whom it asked the
    KV cache for memory, in order, and whether they fit)."""
    running, waiting, in_batch = before
    joined = scheduler.running[len(running):]
    refused = next((i for i, (_, fits) in enumerate(allocations) if not fits), None)
    admitted = {s.request_id for s in joined}
    passed = [] if refused is None else [r for r, fits in allocations[refused:] if fits and r in admitted]
    problem = None
    if scheduler.running[:len(running)] != running:
        problem = ("scheduler.running changed order or lost a sequence: a policy chooses among the *waiting* "
                   "requests; the running ones keep their admission order (the scheduler preempts the newest, "
                   "running[-1], and serves decodes oldest first)")
    elif any(all(s is not w for w in waiting) for s in joined):
        problem = "a sequence that was not waiting was appended to scheduler.running"
    elif list(scheduler.waiting) != [w for w in waiting if all(w is not s for s in joined)]:
        problem = ("scheduler.waiting is not the queue it was, less the admitted requests: take out the ones you "
                   "admit and leave the others in their order (arrival order, a preempted sequence at the front)")
    elif batch.seqs[in_batch:] != joined:
        problem = "every admitted request goes into the batch (batch.add), in the order it was admitted"
    elif any(s.status is not SequenceStatus.RUNNING for s in joined):
        problem = "a request was admitted without KV memory: scheduler.allocate(seq) first, and only if it is True"
    elif batch.num_batched_tokens > scheduler.max_num_batched_tokens:
        problem = (f"the batch holds {batch.num_batched_tokens} tokens, more than max_num_batched_tokens="
                   f"{scheduler.max_num_batched_tokens}: a request computes at most what the budget has left "
                   "(scheduler.num_new_tokens), and what it takes is gone for the next")
    elif len(scheduler.running) > scheduler.max_num_seqs:
        problem = f"{len(scheduler.running)} sequences run, more than max_num_seqs={scheduler.max_num_seqs}"
    elif batch.preempted and joined:
        problem = "requests were admitted in a step that preempted a sequence: memory is short, admit none"
    elif passed:
        problem = (f"the KV cache had no memory for {allocations[refused][0]}, and then {passed} got memory and "
                   "were admitted: when the request you chose gets no memory, stop. Smaller ones "
                   "taking the memory it waits for could keep it waiting forever, however much it has aged")
    if problem:
        raise CheckFailed(f"{POLICY}, {where}: {problem}\n  the rules: {POLICY_RULES}")


def _simulate_policy(policy: Callable, seed: int) -> None:
    limits, requests = workloads.random_workload(seed)
    described = workloads.describe(seed, limits, requests)

    def guarded(scheduler: Scheduler, batch: ScheduledBatch, budget: int) -> None:
        before = (list(scheduler.running), list(scheduler.waiting), len(batch.seqs))
        where = f"at step {step} ({described})"
        _check_step(scheduler, batch, before, call_policy(policy, scheduler, batch, budget, where), where)

    scheduler = workloads.paged_scheduler(limits, SchedulingPolicy(admit=guarded))
    queue = workloads.arrivals(requests)
    for step in range(1000):
        while queue and queue[0][0] <= step:
            scheduler.add_request(queue.pop(0)[1])
        if not queue and not scheduler.has_unfinished_requests():
            blocks = scheduler.kv_cache_manager.block_manager
            if blocks.num_free_blocks != blocks.num_blocks:
                raise CheckFailed(f"{POLICY}: {blocks.num_blocks - blocks.num_free_blocks} KV blocks are still "
                                  f"held after every request finished ({described})")
            return
        workloads.finish_step(scheduler, scheduler.schedule())
    raise CheckFailed(f"{POLICY}: the workload did not finish in 1000 steps ({described}): "
                      f"{len(scheduler.waiting)} requests are still waiting; does your policy admit anyone when "
                      "it could?")


def check_policy(policy: Callable) -> None:
    """Who goes first in hand-made queues, then the rules of every admission step on random workloads."""
    fifo_or_reversed = {("r0", "r1"): "you admitted in arrival order: choose the request with the shortest prompt "
                                      "among all the waiting ones, not the head of the queue",
                        ("r0", "r2"): "you admitted the longest prompts first: the shortest goes first "
                                      "(the smallest key, ascending order)"}
    _order_case(policy, "four fresh requests", [40, 6, 20, 12], [0, 0, 0, 0], 2, ["r1", "r3"], fifo_or_reversed)
    _order_case(policy, "an old long request among fresh short ones", [6, 40, 8], [0, 1000, 0], 1, ["r1"],
                {("r0",): "a request that has waited 1000 steps must not lose to fresh "
                          "short ones, or a long prompt starves while short ones keep coming: age the requests "
                          "with scheduler.steps_waited(seq)"})
    for seed in workloads.SEEDS:
        _simulate_policy(policy, seed)
    print(f"check_policy passed: shortest first among fresh requests, an old request first, and on "
          f"{len(workloads.SEEDS)} random workloads every admission step kept the rules and every request finished")
