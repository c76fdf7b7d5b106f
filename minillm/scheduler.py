"""Decides, before every step, which sequences run and how many of their tokens go in.

This is the baseline: requests are admitted first come, first served, up to max_num_seqs at once,
each with its whole prompt in one step; running sequences then add one token per step. A newly
admitted prompt and the running decodes share a step, since the batch is flattened and needs no
padding.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from minillm.kv_cache import ContiguousKVCache
from minillm.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]  # tokens of each sequence that this step computes


class Scheduler:
    def __init__(self, max_num_seqs: int, kv_cache: ContiguousKVCache | None) -> None:
        self.max_num_seqs = max_num_seqs
        self.kv_cache = kv_cache
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add_request(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        now = time.time()
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting.popleft()
            if self.kv_cache is not None:
                self.kv_cache.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            seq.metrics.first_scheduled_time = now
            self.running.append(seq)
        # Without a cache nothing is ever computed for good, so every step feeds every token again.
        return ScheduledBatch(list(self.running), [s.num_tokens - s.num_computed_tokens for s in self.running])

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if self.kv_cache is not None:
            self.kv_cache.free(seq)
        seq.status = SequenceStatus.FINISHED

    def find(self, request_id: str) -> Sequence | None:
        return next((s for s in (*self.running, *self.waiting) if s.request_id == request_id), None)
