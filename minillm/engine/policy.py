"""Scheduling policies: the two decisions of a step that the scheduler leaves to a policy, chosen with
the engine argument `scheduling_policy` (vLLM's name).

- `token_budget(scheduler) -> int`: the tokens the step may compute. Running sequences take their
  share of it first (decodes, then the rest of prompts being prefilled, in chunks).
- `admit(scheduler, batch, budget)`: which waiting requests join the step, with the budget left.

Everything else is the scheduler's, the same under every policy: who of the running goes first,
preemption when the KV cache runs out, and the bookkeeping after the step.

"fcfs", vLLM's default, is the only policy by name: first come, first served, every step as large
as `max_num_batched_tokens` allows. Other orders and budgets are the course's exercises (04:
shortest prompt first, with aging; 07: a budget from a latency target); they go in as objects:

    LLM(model, scheduling_policy=SchedulingPolicy(admit=admit_shortest_first))

Any object with the two methods will do, and so will a class with them, which the engine
instantiates without arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minillm.engine.scheduler import ScheduledBatch, Scheduler


def max_token_budget(scheduler: Scheduler) -> int:
    """Every step may compute max_num_batched_tokens: vLLM's fixed cap."""
    return scheduler.max_num_batched_tokens


def admit_fcfs(scheduler: Scheduler, batch: ScheduledBatch, budget: int) -> None:
    """Waiting requests join the batch first come, first served, while the step has token budget
    left, fewer than max_num_seqs run, and the cache has room for the next one's tokens. None join
    a step that preempted: memory is short, and the victim, now at the head of the queue, could
    otherwise be readmitted at once through its own cached prefix blocks and undo the preemption."""
    while scheduler.waiting and budget > 0 and not batch.preempted and len(scheduler.running) < scheduler.max_num_seqs:
        seq = scheduler.waiting[0]
        if not scheduler.allocate(seq):
            break  # the head of the queue waits for memory, and everyone behind it too
        scheduler.waiting.popleft()
        scheduler.running.append(seq)
        budget -= batch.add(seq, scheduler.num_new_tokens(seq, budget))


@dataclass
class SchedulingPolicy:
    """A policy made of two functions; first come, first served's where one is not given."""

    admit: Callable[[Scheduler, ScheduledBatch, int], None] = admit_fcfs
    token_budget: Callable[[Scheduler], int] = max_token_budget


# The policies an engine argument names (config/engine.py's SCHEDULING_POLICIES), each made afresh
# for every scheduler: a policy is a plain object, and one engine's must not be another's.
POLICIES: dict[str, Callable[[], SchedulingPolicy]] = {"fcfs": SchedulingPolicy}


def resolve_policy(policy: str | SchedulingPolicy) -> SchedulingPolicy:
    """The policy SchedulerConfig.scheduling_policy names, or the object it holds (already checked)."""
    return POLICIES[policy]() if isinstance(policy, str) else policy
