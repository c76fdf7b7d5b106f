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

from minillm.spec_decode.acceptance import AcceptanceCounts

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


@dataclass
class LatencyHistogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def metric(self, name: str, labels: dict[str, str]) -> Histogram:
        cumulative, running = {}, 0
        for bound, count in zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.counts):
            running += count
            cumulative[bound] = running
        return Histogram(name, labels, running, self.total, cumulative)


@dataclass
class EngineCounters:
    """What the engine adds up while it serves; gauges are read from it when asked."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0
    request_success: Tally = field(default_factory=Tally)  # by finish reason
    time_to_first_token: LatencyHistogram = field(default_factory=LatencyHistogram)
    time_per_output_token: LatencyHistogram = field(default_factory=LatencyHistogram)
    e2e_request_latency: LatencyHistogram = field(default_factory=LatencyHistogram)


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
        c.time_to_first_token.metric("vllm:time_to_first_token_seconds", labels),
        c.time_per_output_token.metric("vllm:request_time_per_output_token_seconds", labels),
        c.e2e_request_latency.metric("vllm:e2e_request_latency_seconds", labels),
    ]
    if spec is not None:
        metrics += [Counter("vllm:spec_decode_num_drafts", labels, spec.drafts),
                    Counter("vllm:spec_decode_num_draft_tokens", labels, spec.draft_tokens),
                    Counter("vllm:spec_decode_num_accepted_tokens", labels, spec.accepted),
                    Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, list(spec.per_position))]
    return metrics
