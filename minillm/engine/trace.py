"""Per-step events: what the engine did in each step, in plain numbers.

The widgets draw only these events (they never simulate the engine), and tests read them too.
Events hold no timestamps, so the same workload gives the same events on any machine.

    with minillm.engine.trace.record(llm) as trace:
        llm.generate(prompts, params)
    trace.events[0].seqs[0].kv_tokens
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SeqState:
    request_id: str
    prefill_tokens: int  # prompt tokens computed in this step
    decode_tokens: int  # generated tokens fed back in this step
    kv_tokens: int  # tokens whose K/V are held in the cache after this step
    kv_reserved_tokens: int  # cache capacity reserved for this sequence, in tokens
    finish_reason: str | None = None  # set in the step the sequence finished
    block_table: tuple[int, ...] = ()  # paged cache: pool blocks holding this sequence's K/V, in order
    num_cached_tokens: int = 0  # paged cache: prompt tokens that were prefix-cache hits
    # Speculative decoding: the draft tokens this step verified, how many of them the target accepted
    # (a prefix), and the target's own token after them (recovered after a rejection, or the bonus).
    spec_token_ids: tuple[int, ...] = ()
    num_accepted_tokens: int = 0
    target_token_id: int | None = None


@dataclass(frozen=True)
class StepEvent:
    step: int
    seqs: tuple[SeqState, ...]
    num_waiting: int  # requests still queued after this step
    num_free_blocks: int = 0  # paged cache, after this step: blocks no sequence holds
    cached_blocks: tuple[int, ...] = ()  # paged cache: blocks holding a reusable prefix (held or free)
    preempted: tuple[str, ...] = ()  # requests sent back to the queue by this step

    @property
    def kv_tokens(self) -> int:
        return sum(s.kv_tokens for s in self.seqs)

    @property
    def drained(self) -> bool:
        """The step left the engine nothing to do: nothing queued, and every sequence in it finished."""
        return self.num_waiting == 0 and all(s.finish_reason is not None for s in self.seqs)

    @property
    def kv_reserved_tokens(self) -> int:
        return sum(s.kv_reserved_tokens for s in self.seqs)


@dataclass(frozen=True)
class TraceInfo:
    """What stays fixed during a run; multiply tokens by kv_bytes_per_token to get bytes."""

    model: str
    device: str
    dtype: str
    kv_cache: str
    kv_bytes_per_token: int
    device_memory_bytes: int
    max_model_len: int
    max_num_seqs: int
    block_size: int = 0  # paged cache only
    num_kv_blocks: int = 0  # paged cache only
    speculative_method: str | None = None  # "draft_model" or "ngram" when speculating
    num_speculative_tokens: int = 0  # k: draft tokens proposed per sequence and step, at most


@dataclass
class Trace:
    info: TraceInfo
    events: list[StepEvent] = field(default_factory=list)

    def __call__(self, event: StepEvent) -> None:
        self.events.append(event)

    @property
    def request_ids(self) -> list[str]:
        """Every request seen, in order of first appearance."""
        return list(dict.fromkeys(s.request_id for e in self.events for s in e.seqs))

    def __repr__(self) -> str:
        peak = max((e.kv_tokens for e in self.events), default=0)
        return (f"Trace(steps={len(self.events)}, requests={len(self.request_ids)}, "
                f"peak_kv_tokens={peak}, kv_cache={self.info.kv_cache!r})")


@contextlib.contextmanager
def record(llm) -> Iterator[Trace]:
    """Record every step the engine takes inside the `with` block (takes an LLM or an LLMEngine)."""
    engine = getattr(llm, "llm_engine", llm)
    trace = Trace(engine.trace_info())
    engine.step_listeners.append(trace)
    try:
        yield trace
    finally:
        engine.step_listeners.remove(trace)
