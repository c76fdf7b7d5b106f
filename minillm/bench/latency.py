"""Latency and throughput of served requests, the figures vLLM's serving benchmarks report.

Per request: time in queue (arrival to first scheduled), time to first token (TTFT: arrival to the
first generated token, the wait a user feels), time per output token (TPOT: the gap between later
tokens, the speed a user reads at) and end-to-end latency. Aggregated: their p50 and p95, and
output tokens per second of wall time.
"""

from __future__ import annotations

import math

from minillm.outputs import RequestOutput

LATENCIES = ("queue", "ttft", "tpot", "e2e")


def request_latencies(out: RequestOutput, start: float | None = None) -> dict[str, float]:
    """Seconds; start: when the request arrived, if not its own arrival_time (an offline benchmark
    submits every request at once, whether or not the system under test takes them all in)."""
    m = out.metrics
    arrival = m.arrival_time if start is None else start
    n = len(out.outputs[0].token_ids)
    return {"queue": m.first_scheduled_time - arrival, "ttft": m.first_token_time - arrival,
            "tpot": (m.last_token_time - m.first_token_time) / (n - 1) if n > 1 else math.nan,
            "e2e": m.finished_time - arrival}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy.percentile does by default."""
    values = sorted(v for v in values if not math.isnan(v))
    if not values:
        return math.nan
    rank = (len(values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def summarize(latencies: list[dict[str, float]], output_tokens: int, seconds: float) -> dict[str, float]:
    """tokens_per_s, and p50/p95 of each latency in milliseconds (keys like ttft_p50_ms)."""
    summary = {"requests": len(latencies), "output_tokens": output_tokens, "seconds": seconds,
               "tokens_per_s": output_tokens / seconds}
    for key in LATENCIES:
        values = [lat[key] for lat in latencies if key in lat]
        if values:
            for q in (50, 95):
                summary[f"{key}_p{q}_ms"] = percentile(values, q) * 1e3
    return summary
