"""Decides, before every step, which sequences run and how many of their tokens go in.

Every step has a token budget, and at most `max_num_seqs` sequences run at once. Running sequences
are served first: their decodes, oldest first, at one token each, then the prompts still being
prefilled, each the rest of it or as much as the budget has left. Whatever budget remains admits
waiting requests, their prompts cut into chunks that fit (chunked prefill). So one step can mix
prefill chunks and decodes, and a long prompt never stalls the decodes of everyone else. The batch
is flattened, so the mix needs no padding.

The budget and the admission are the scheduling policy's (policy.py, the engine argument
`scheduling_policy`): by default the whole `max_num_batched_tokens` every step, and first come,
first served.

With the paged cache a request is admitted only when the pool has blocks for its prompt. When a
running sequence needs a block for its next token and none is free, the most recently admitted
sequence is preempted: its blocks are freed and it goes back to the front of the queue, to be
recomputed from its tokens later (its output does not change). No request is admitted in a step
that preempted.

With speculative decoding (`num_lookahead_slots` = k), a decode also reserves cache slots and budget
for the k draft tokens the step will verify; `update` keeps the K/V of the drafts the target accepted
and gives back the blocks that only held rejected ones.

Prefix caching within a step: a prompt's full blocks go into the prefix cache as soon as a sequence
is added to a batch that computes them (vLLM v1 caches a block when it allocates its slots), so a
request admitted after it in the same step hits them and computes only the rest of its prompt: n
completions of one prompt, or a burst of requests sharing a system prompt, compute it once in their
first step. It is correct because every layer of a step stores the K/V of all its tokens before any
attention reads them (attention/paged.py). It is safe because a registered block is always computed:
a sequence added to a batch is never preempted later in the same pass (only a decode that needs a
block preempts, decodes come before prompts, and the victim is the newest running sequence, which
the pass has not reached yet), and a scheduled step runs; if it fails instead, the engine takes the
blocks back out of the cache (`forget_uncomputed_blocks`). Blocks of generated tokens are registered
once computed: under async scheduling the newest token is still a placeholder when the next step is
scheduled, and a speculative step's drafts may be rejected.

Which tokens a step gives each sequence, and whether it stops there, is not decided here: in the
engine's step the output processor appends the tokens and decides the stops, once, and `update` then
follows what it decided (the cache advanced, finished sequences freed).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from minillm.config.engine import SchedulerConfig
from minillm.engine.policy import resolve_policy
from minillm.engine.runner_output import ModelRunnerOutput
from minillm.kv.cache_manager import KVCacheManager
from minillm.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens of each sequence that this step computes
    preempted: list[Sequence]  # sent back to the queue by this step's scheduling
    # Whether each sequence samples a token this step: not while a prompt chunk leaves some of
    # the prompt for later.
    do_sample: list[bool]
    # Draft tokens each sequence may verify this step (speculative decoding), counted in num_new_tokens.
    num_spec_tokens: list[int] = field(default_factory=list)
    # Where a prompt's blocks are registered as they are scheduled (None: nowhere, for checks that
    # schedule without a cache).
    kv_cache_manager: KVCacheManager | None = None

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def add(self, seq: Sequence, num_new_tokens: int, num_spec_tokens: int = 0) -> int:
        """Put seq in the batch, computing num_new_tokens of its tokens and verifying up to
        num_spec_tokens drafts after them; returns the tokens that takes from the budget."""
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens + num_spec_tokens)
        self.do_sample.append(seq.num_computed_tokens + num_new_tokens == seq.num_tokens)
        self.num_spec_tokens.append(num_spec_tokens)
        # For a request admitted after it in this step (see above); only while the prompt is being
        # computed (a decode's blocks are registered once computed), and not for a sequence given no
        # memory (an admission policy's mistake, which its checks name).
        if (self.kv_cache_manager is not None and seq.num_computed_tokens < seq.num_prompt_tokens
                and seq.status is SequenceStatus.RUNNING):
            end = seq.num_computed_tokens + num_new_tokens
            self.kv_cache_manager.cache_blocks(seq, min(end, seq.num_prompt_tokens))
        return num_new_tokens + num_spec_tokens

    def select(self, rows: list[int]) -> ScheduledBatch:
        """The batch of the sequences `rows` only, in that order."""
        return ScheduledBatch([self.seqs[i] for i in rows], [self.num_new_tokens[i] for i in rows], self.preempted,
                              [self.do_sample[i] for i in rows], [self.num_spec_tokens[i] for i in rows])

    def decodes_first(self) -> None:
        """Reorder so that sequences computing one token come first, in their order: attention
        then runs them through the decode kernel in one call and only the rest through prefill."""
        order = sorted(range(len(self.seqs)), key=lambda i: self.num_new_tokens[i] > 1)
        for name in ("seqs", "num_new_tokens", "do_sample", "num_spec_tokens"):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in order])


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.policy = resolve_policy(config.scheduling_policy)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_steps = 0  # schedule() calls so far: a clock that ticks alike on every machine
        self.arrival_steps: dict[str, int] = {}  # request id -> num_steps when it was added

    @property
    def max_num_seqs(self) -> int:
        return self.config.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self.config.max_num_batched_tokens

    def add_request(self, seq: Sequence) -> None:
        self.arrival_steps[seq.request_id] = self.num_steps
        self.waiting.append(seq)

    def steps_waited(self, seq: Sequence) -> int:
        """Steps scheduled since seq arrived: its age on the step clock, for a scheduling policy that
        ages requests so that none waits forever (exercise 04)."""
        return self.num_steps - self.arrival_steps.get(seq.request_id, self.num_steps)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch([], [], [], [], kv_cache_manager=self.kv_cache_manager)
        budget = self.policy.token_budget(self)
        # Decodes first, then prompts still being prefilled (vLLM's chunked-prefill policy): a long
        # prompt's chunk takes what the decodes leave, so a small budget never stalls them.
        for seq in sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1):
            if budget <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted a moment ago, for an older one
                continue
            n = self.num_new_tokens(seq, budget)
            lookahead = self.num_lookahead_tokens(seq, n, budget)
            if not self._reserve(seq, seq.num_computed_tokens + n + lookahead, batch):
                continue
            budget -= batch.add(seq, n, lookahead)
        self.policy.admit(self, batch, budget)
        batch.decodes_first()
        self.num_steps += 1
        return batch

    def num_new_tokens(self, seq: Sequence, budget: int) -> int:
        """Tokens seq computes this step: all it has not computed yet, at most the budget left."""
        return self.kv_cache_manager.num_new_tokens(seq, budget)

    def num_lookahead_tokens(self, seq: Sequence, num_new_tokens: int, budget: int) -> int:
        """Draft tokens a decode may verify this step: k, fewer near max_tokens (a step emits at most
        one token more than it verifies) or when the budget runs short; none for a prompt, even a
        last chunk of one token: a seeded request's first token is then drawn the same way (without
        drafts) however its prompt was chunked, as it is in plain decoding."""
        decoding = (num_new_tokens == 1 and seq.num_computed_tokens + 1 == seq.num_tokens
                    and seq.num_output_tokens > 0)
        if not self.config.num_lookahead_slots or not decoding:
            return 0
        return max(0, min(self.config.num_lookahead_slots, seq.max_len - seq.num_tokens - 1, budget - 1))

    def allocate(self, seq: Sequence) -> bool:
        """Cache memory for a waiting sequence's tokens, which then counts as running; False (and
        nothing changed) if the cache has no room for it yet."""
        if not self.kv_cache_manager.can_allocate(seq):
            return False
        hit_tokens = self.kv_cache_manager.allocate(seq)
        if seq.metrics.first_scheduled_time is None:
            seq.num_cached_tokens = hit_tokens
        seq.status = SequenceStatus.RUNNING
        if seq.metrics.first_scheduled_time is None:
            seq.metrics.first_scheduled_time = time.time()
        return True

    def _reserve(self, seq: Sequence, num_tokens: int, batch: ScheduledBatch) -> bool:
        """Cache room for seq's first num_tokens tokens, preempting the newest sequences until they
        fit; False if seq itself had to go."""
        while not self.kv_cache_manager.can_append(seq, num_tokens):
            victim = self.running[-1]
            self.preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        self.kv_cache_manager.append(seq, num_tokens)
        return True

    def update(self, batch: ScheduledBatch, output: ModelRunnerOutput) -> None:
        """A step's aftermath, once the output processor has appended each sequence's tokens and
        decided its stop (OutputProcessor.process_outputs): the cache holds what the step computed
        (and registers the blocks it filled in the prefix cache); finished sequences leave and free
        their memory."""
        for seq, n, lookahead, spec, tokens in zip(batch.seqs, batch.num_new_tokens, batch.num_spec_tokens,
                                                   output.spec_token_ids, output.sampled_token_ids):
            # Of the drafts verified, the accepted ones are computed; the rejected ones' K/V stay in
            # the cache as garbage, overwritten before anyone reads them. Never past the tokens kept
            # (a stop cuts the run of tokens a step produced).
            if seq.status is SequenceStatus.WAITING:  # preempted since the step was queued (async scheduling)
                if seq.finish_reason is not None:
                    self.finish(seq)
                continue  # its tokens are recomputed when it runs again
            computed = n - lookahead + (len(tokens) - 1 if spec else 0)
            self.kv_cache_manager.mark_computed(seq, min(computed, seq.num_tokens - seq.num_computed_tokens))
            if seq.finish_reason is not None:
                self.finish(seq)
            elif lookahead:
                self.kv_cache_manager.truncate(seq)  # blocks that held only rejected drafts

    def forget_uncomputed_blocks(self) -> None:
        """The step just scheduled will not run (it failed, or was interrupted): the prompt blocks it
        registered hold no K/V, and leave the prefix cache."""
        for seq in self.running:
            self.kv_cache_manager.forget_uncomputed(seq)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv_cache_manager.free(seq)
        seq.num_computed_tokens = seq.num_draft_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv_cache_manager.free(seq)
        self.arrival_steps.pop(seq.request_id, None)
        seq.status = SequenceStatus.FINISHED

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)

    def __repr__(self) -> str:  # as a policy's argument in a check's message
        return (f"Scheduler(running={[s.request_id for s in self.running]}, "
                f"waiting={[s.request_id for s in self.waiting]}, num_steps={self.num_steps})")
