"""`LLM.get_metrics()`: the engine's counters, gauges and histograms as vLLM's metrics reader returns
them (the same classes and metric names), so that code reading them runs on vLLM unchanged.

    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            print(m.values)
"""

from __future__ import annotations

import bisect
from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minillm.spec_decode.acceptance import AcceptanceCounts

if TYPE_CHECKING:
    from minillm.sequence import Sequence

# Seconds, as vLLM buckets its latency histograms (a subset).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0)


@dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Vector(Metric):
    values: list[int]


@dataclass
class Histogram(Metric):
    count: int
    sum: float
    buckets: dict[str, int]  # upper bound ("+Inf" last) -> observations at or below it, cumulative


def one_two_five(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to limit: vLLM's buckets for token counts, up to the context length."""
    bounds, scale = [], 1
    while True:
        for step in (1, 2, 5):
            if step * scale > limit:
                return tuple(bounds)
            bounds.append(float(step * scale))  # written 1.0, 2.0, ... as Prometheus writes bounds
        scale *= 10


@dataclass
class BucketCounts:
    """Observations counted into buckets with these upper bounds, and one past the last (+Inf)."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def metric(self, name: str, labels: dict[str, str]) -> Histogram:
        cumulative, running = {}, 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self.counts):
            running += count
            cumulative[bound] = running
        return Histogram(name, labels, running, self.total, cumulative)


# vLLM's request histograms, each (counters' field, metric name); the latencies are in seconds.
REQUEST_HISTOGRAMS = (
    ("time_to_first_token", "vllm:time_to_first_token_seconds"),
    ("inter_token_latency", "vllm:inter_token_latency_seconds"),
    ("time_per_output_token", "vllm:request_time_per_output_token_seconds"),
    ("e2e_request_latency", "vllm:e2e_request_latency_seconds"),
    ("queue_time", "vllm:request_queue_time_seconds"),
    ("prefill_time", "vllm:request_prefill_time_seconds"),
    ("decode_time", "vllm:request_decode_time_seconds"),
    ("inference_time", "vllm:request_inference_time_seconds"),
    ("prompt_tokens_per_request", "vllm:request_prompt_tokens"),
    ("generation_tokens_per_request", "vllm:request_generation_tokens"),
)


@dataclass
class EngineCounters:
    """What the engine adds up while it serves; gauges are read from it when asked."""

    max_model_len: int  # the largest bucket of the token-count histograms
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0
    request_success: Tally = field(default_factory=Tally)  # by finish reason
    time_to_first_token: BucketCounts = field(default_factory=BucketCounts)
    inter_token_latency: BucketCounts = field(default_factory=BucketCounts)  # once per step that adds tokens
    time_per_output_token: BucketCounts = field(default_factory=BucketCounts)
    e2e_request_latency: BucketCounts = field(default_factory=BucketCounts)
    queue_time: BucketCounts = field(default_factory=BucketCounts)  # arrival to first scheduled
    prefill_time: BucketCounts = field(default_factory=BucketCounts)  # first scheduled to first token
    decode_time: BucketCounts = field(default_factory=BucketCounts)  # first token to last
    inference_time: BucketCounts = field(default_factory=BucketCounts)  # first scheduled to last token
    prompt_tokens_per_request: BucketCounts = field(init=False)
    generation_tokens_per_request: BucketCounts = field(init=False)

    def __post_init__(self) -> None:
        self.prompt_tokens_per_request = BucketCounts(one_two_five(self.max_model_len))
        self.generation_tokens_per_request = BucketCounts(one_two_five(self.max_model_len))

    def observe(self, seq: Sequence, num_output_tokens: int, last_token_time: float | None) -> None:
        """seq after a step it took part in; num_output_tokens and last_token_time: its state before."""
        new_tokens = seq.num_output_tokens - num_output_tokens
        self.generation_tokens += new_tokens
        m = seq.metrics
        if num_output_tokens == 0 and new_tokens:  # its first token: the prompt is done
            self.prompt_tokens += seq.num_prompt_tokens
            self.prefix_cache_queries += seq.num_prompt_tokens
            self.prefix_cache_hits += seq.num_cached_tokens
            self.time_to_first_token.observe(m.first_token_time - m.arrival_time)
        elif new_tokens:  # as vLLM: one gap per step, however many tokens speculation added in it
            self.inter_token_latency.observe(m.last_token_time - last_token_time)
        if seq.finish_reason is None:
            return
        self.request_success[seq.finish_reason] += 1
        self.e2e_request_latency.observe(m.finished_time - m.arrival_time)
        if seq.num_output_tokens > 1:
            self.time_per_output_token.observe((m.last_token_time - m.first_token_time) / (seq.num_output_tokens - 1))
        self.queue_time.observe(m.first_scheduled_time - m.arrival_time)
        self.prefill_time.observe(m.first_token_time - m.first_scheduled_time)
        self.decode_time.observe(m.last_token_time - m.first_token_time)
        self.inference_time.observe(m.last_token_time - m.first_scheduled_time)
        self.prompt_tokens_per_request.observe(seq.num_prompt_tokens)
        self.generation_tokens_per_request.observe(seq.num_output_tokens)


def collect_metrics(labels: dict[str, str], counters: EngineCounters, num_running: int, num_waiting: int,
                    kv_cache_usage: float, spec: AcceptanceCounts | None) -> list[Metric]:
    """Everything, under vLLM's names; the speculative counters only when the engine speculates."""
    c = counters
    metrics: list[Metric] = [
        Gauge("vllm:num_requests_running", labels, num_running),
        Gauge("vllm:num_requests_waiting", labels, num_waiting),
        Gauge("vllm:kv_cache_usage_perc", labels, kv_cache_usage),
        Counter("vllm:prefix_cache_queries", labels, c.prefix_cache_queries),
        Counter("vllm:prefix_cache_hits", labels, c.prefix_cache_hits),
        Counter("vllm:num_preemptions", labels, c.num_preemptions),
        Counter("vllm:prompt_tokens", labels, c.prompt_tokens),
        Counter("vllm:generation_tokens", labels, c.generation_tokens),
        *(Counter("vllm:request_success", {**labels, "finished_reason": reason}, n)
          for reason, n in sorted(c.request_success.items())),
        *(getattr(c, name).metric(metric, labels) for name, metric in REQUEST_HISTOGRAMS),
    ]
    if spec is not None:
        metrics += [Counter("vllm:spec_decode_num_drafts", labels, spec.drafts),
                    Counter("vllm:spec_decode_num_draft_tokens", labels, spec.draft_tokens),
                    Counter("vllm:spec_decode_num_accepted_tokens", labels, spec.accepted),
                    Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, list(spec.per_position))]
    return metrics
