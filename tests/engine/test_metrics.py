"""Request latencies and their aggregation, on hand-made timings."""

from __future__ import annotations

import math

import pytest

from minillm.bench.latency import percentile, request_latencies, summarize
from minillm.outputs import CompletionOutput, RequestMetrics, RequestOutput


def output(arrival: float, scheduled: float, first: float, last: float, finished: float, n: int) -> RequestOutput:
    metrics = RequestMetrics(arrival, scheduled, first, last, finished)
    return RequestOutput("0", None, [1], [CompletionOutput(0, "", list(range(n)), None, None, "length")], True, metrics)


def test_latencies_of_one_request():
    lat = request_latencies(output(10.0, 10.5, 11.0, 13.0, 13.0, n=5))
    assert lat == pytest.approx({"queue": 0.5, "ttft": 1.0, "tpot": 0.5, "e2e": 3.0})
    assert request_latencies(output(10.0, 10.5, 11.0, 13.0, 13.0, n=5), start=9.0)["ttft"] == pytest.approx(2.0)
    assert math.isnan(request_latencies(output(0, 0, 1, 1, 1, n=1))["tpot"])  # one token: no gap to time


def test_percentiles_interpolate_like_numpy_and_skip_nan():
    values = [4.0, 1.0, 3.0, 2.0, math.nan]
    assert percentile(values, 50) == 2.5 and percentile(values, 95) == pytest.approx(3.85)
    assert math.isnan(percentile([math.nan], 50))


def test_summary_in_milliseconds_and_tokens_per_second():
    lats = [{"queue": 0.0, "ttft": t, "tpot": 0.01, "e2e": 1.0} for t in (0.1, 0.2, 0.3)]
    summary = summarize(lats, output_tokens=300, seconds=2.0)
    assert summary["tokens_per_s"] == 150 and summary["ttft_p50_ms"] == pytest.approx(200)
    assert summary["tpot_p95_ms"] == pytest.approx(10) and summary["requests"] == 3
