"""Async scheduling (vLLM's `async_scheduling`): the host's work between two steps done while the
device runs the first.

A synchronous engine reads each step's tokens back before it schedules the next step, so between two
steps the device idles while the host processes the outputs (text, stops), updates the scheduler and
the cache, schedules and prepares the next step. With async scheduling the engine queues step N + 1
behind step N before it reads N's tokens, and reads them while the device runs N + 1:

- While N + 1 is scheduled and prepared, every sequence of N counts N's tokens as computed and the
  token N sampled for it as its newest, a placeholder (`placeholders`). The scheduler sees the
  decode that N + 1 must run, and reserves its cache slot, as if N had been read.
- The runner copies each placeholder's value on the device, from N's sampled tokens into N + 1's
  input (`ModelRunner.prepare`): the host never needs it.
- N's tokens are read once N + 1 is queued. A sequence that N stopped (an end-of-sequence token, a
  stop string) has one token too many computed in N + 1, which is dropped when N + 1 is read; its
  cache blocks were freed when N stopped it, and N + 1's store into them is ordered on the device
  before any later step's, so nothing leaks and nothing reads it.

Only steps whose next step does not need their tokens on the host may be left in flight
(`LLMEngine._may_stay_in_flight`): not a speculative step, not a step where a sequence has
penalties. Greedy output is the same as the synchronous engine's, token for token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from minillm.engine.runner_output import AsyncModelRunnerOutput
from minillm.engine.scheduler import ScheduledBatch
from minillm.engine.trace import SeqState
from minillm.sequence import SequenceStatus

# A placeholder's value on the host; the step's input on the device is the sampled token itself.
PLACEHOLDER_TOKEN_ID = 0


@dataclass
class InFlightStep:
    batch: ScheduledBatch
    output: AsyncModelRunnerOutput
    states: list[SeqState] | None  # its sequences as it was queued, for the step listeners


@contextlib.contextmanager
def placeholders(previous: InFlightStep | None) -> Iterator[None]:
    """While the next step is scheduled and prepared, the sequences of `previous` (a step queued and not
    yet read) as they will be once it is: its tokens computed, and the token it sampled appended as a
    placeholder. Undone after; a sequence preempted meanwhile starts again from nothing."""
    if previous is None:
        yield
        return
    advanced = []
    for seq, n in zip(previous.batch.seqs, previous.batch.num_new_tokens):
        if seq.status is not SequenceStatus.RUNNING:  # aborted since it was queued
            continue
        sampled = seq in previous.output.token_rows
        seq.num_computed_tokens += n
        if sampled:
            seq.token_ids.append(PLACEHOLDER_TOKEN_ID)
        advanced.append((seq, n, sampled))
    try:
        yield
    finally:
        for seq, n, sampled in advanced:
            if sampled:
                seq.token_ids.pop()
            if seq.status is SequenceStatus.RUNNING:
                seq.num_computed_tokens -= n
