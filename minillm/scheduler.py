"""Decides, before every step, which sequences run and how many of their tokens go in.

Requests are admitted first come, first served, up to max_num_seqs at once, each with its whole
prompt in one step; running sequences then add one token per step. A newly admitted prompt and the
running decodes share a step, since the batch is flattened and needs no padding.

With the paged cache, a request is admitted only when the pool has blocks for its prompt, and the
running sequences get their next slot first. When a running sequence needs a block and none is
free, the most recently admitted sequence is preempted: its blocks are freed and it goes back to
the front of the queue, to be recomputed from its tokens later (its output does not change).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from minillm.block_manager import BlockManager
from minillm.kv_cache import ContiguousKVCache
from minillm.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens of each sequence that this step computes
    preempted: list[Sequence]  # sent back to the queue by this step's scheduling


class Scheduler:
    def __init__(self, max_num_seqs: int, kv_cache: ContiguousKVCache | None,
                 block_manager: BlockManager | None = None) -> None:
        self.max_num_seqs = max_num_seqs
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add_request(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        preempted = self._reserve_decode_slots() if self.block_manager is not None else []
        now = time.time()
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.block_manager is not None:
                if not self.block_manager.can_allocate(seq):
                    break
                hit_tokens = self.block_manager.allocate(seq)
                if seq.metrics.first_scheduled_time is None:
                    seq.num_cached_tokens = hit_tokens
            elif self.kv_cache is not None:
                if not self.kv_cache.can_allocate(seq):
                    break
                self.kv_cache.allocate(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
            self.running.append(seq)
        # Without a cache nothing is ever computed for good, so every step feeds every token again.
        return ScheduledBatch(list(self.running), [s.num_tokens - s.num_computed_tokens for s in self.running],
                              preempted)

    def _reserve_decode_slots(self) -> list[Sequence]:
        preempted = []
        for seq in list(self.running):
            if seq not in self.running:  # preempted a moment ago to make room for an earlier one
                continue
            while not self.block_manager.can_append(seq):
                victim = self.running[-1]
                self.preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.block_manager.append_slots(seq)
        return preempted

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if self.block_manager is not None:
            self.block_manager.free(seq)
        elif self.kv_cache is not None:
            self.kv_cache.free(seq)
        seq.status = SequenceStatus.FINISHED

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)
