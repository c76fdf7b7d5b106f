"""`minillm bench serve`: the seeded workload and arrivals, the statistics on hand-made requests, a
failed request counted rather than fatal, and one run against a server started in this process."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import statistics

import pytest

from minillm.bench.serve import RequestResult, summarize
from minillm.bench.serve_workload import Request, arrival_times, build_workload, parse_range, parse_rates, parse_slo
from minillm.cli import main

CORPUS = list(range(10_000))  # token i at position i: a prompt shows where it was cut


def test_workload_is_seeded_and_within_its_ranges():
    workload = build_workload(CORPUS, 200, (16, 96), (4, 32), seed=3)
    assert workload == build_workload(CORPUS, 200, (16, 96), (4, 32), seed=3)
    assert workload != build_workload(CORPUS, 200, (16, 96), (4, 32), seed=4)
    inputs = [len(r.prompt) for r in workload]
    outputs = [r.output_len for r in workload]
    assert min(inputs) >= 16 and max(inputs) <= 96 and min(outputs) >= 4 and max(outputs) <= 32
    assert len(set(inputs)) > 40 and len(set(outputs)) > 20  # drawn across the range, not one value
    assert all(r.prompt == CORPUS[r.prompt[0]:r.prompt[0] + len(r.prompt)] for r in workload)
    # Another draw (a sweep's next rate): the same lengths, so the same work, cut elsewhere.
    other = build_workload(CORPUS, 200, (16, 96), (4, 32), seed=3, draw=1)
    assert [(len(r.prompt), r.output_len) for r in other] == list(zip(inputs, outputs))
    assert sum(a.prompt != b.prompt for a, b in zip(workload, other)) > 190
    assert {len(r.prompt) for r in build_workload(CORPUS, 10, (32, 32), (8, 8))} == {32}


def test_arguments_parse_and_bad_ones_name_themselves():
    assert parse_range("32") == (32, 32) and parse_range("16:96") == (16, 96)
    assert parse_rates("1,2.5,inf") == [1.0, 2.5, math.inf]
    assert parse_slo("ttft:500") == ("ttft", 500.0)
    for parse, bad in ((parse_range, "0:5"), (parse_range, "9:3"), (parse_range, "a"), (parse_rates, "0,1"),
                       (parse_rates, "fast"), (parse_slo, "latency:5"), (parse_slo, "tpot:-1"), (parse_slo, "ttft")):
        with pytest.raises(ValueError, match="must|takes"):
            parse(bad)
    with pytest.raises(SystemExit):
        main(["bench", "serve", "--input-len", "9:3"])


def test_poisson_arrivals_have_the_rate_asked_for():
    times = arrival_times(20_000, 4.0, seed=0)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.03)  # exponential: spread equal to the mean
    assert times == arrival_times(20_000, 4.0, seed=0)
    assert arrival_times(5, 8.0) == pytest.approx([t / 2 for t in arrival_times(5, 4.0)])  # one pattern, scaled
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]


def done(ttft_ms: float, tpot_ms: float, tokens: int = 11, input_len: int = 20) -> RequestResult:
    """A completed request with these latencies; its chunks one token each, evenly spaced."""
    gaps = [tpot_ms / 1e3] * (tokens - 1)
    return RequestResult(input_len, tokens, success=True, output_tokens=tokens, ttft=ttft_ms / 1e3, itl=gaps,
                         e2el=(ttft_ms + tpot_ms * (tokens - 1)) / 1e3)


def test_summary_percentiles_and_throughputs_on_known_requests():
    results = [done(ttft, 10.0 + i) for i, ttft in enumerate(range(10, 101, 10))]
    results.append(RequestResult(20, 11, error="APIConnectionError"))
    row = summarize(results, duration=2.0)
    assert (row["completed"], row["failed"]) == (10, 1)
    assert row["request_throughput"] == 5.0
    assert row["output_throughput"] == 110 / 2 and row["total_token_throughput"] == (200 + 110) / 2
    # TTFTs 10, 20, ..., 100 ms: ranks interpolated linearly, as numpy.percentile does.
    assert row["ttft_mean_ms"] == pytest.approx(55.0)
    assert (row["ttft_p50_ms"], row["ttft_p95_ms"], row["ttft_p99_ms"]) == pytest.approx((55.0, 95.5, 99.1))
    assert row["tpot_p50_ms"] == pytest.approx(14.5)  # TPOTs 10..19 ms
    assert row["itl_p50_ms"] == pytest.approx(14.5) and row["itl_mean_ms"] == pytest.approx(14.5)
    assert "goodput" not in row  # no SLO, no goodput


def test_goodput_counts_exactly_the_requests_within_the_slo():
    results = [done(100, 20), done(400, 20),  # both within
               done(600, 20),  # TTFT over
               done(100, 150),  # TPOT over
               done(500, 100),  # on both limits: within
               done(300, 0, tokens=1),  # one token: no TPOT to miss
               RequestResult(20, 11, error="failed")]  # a failed request never counts
    row = summarize(results, duration=2.0, slo={"ttft": 500, "tpot": 100})
    assert row["goodput"] == pytest.approx(4 / 2.0)
    assert summarize(results, duration=2.0, slo={"ttft": 200})["goodput"] == pytest.approx(2 / 2.0)
    assert summarize(results, duration=2.0, slo={"e2el": 1000})["goodput"] == pytest.approx(4 / 2.0)


def test_a_refused_request_is_counted_as_failed():
    openai = pytest.importorskip("openai")
    from minillm.bench.serve import run_rate

    with socket.create_server(("127.0.0.1", 0)) as sock:  # a port just freed: nothing listens there
        port = sock.getsockname()[1]

    async def run():
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0) as client:
            return await run_rate(client, "tiny", [Request([1, 2, 3], 4)] * 3, math.inf)

    results, duration = asyncio.run(run())
    assert [r.success for r in results] == [False] * 3 and all("Connection" in r.error for r in results)
    row = summarize(results, duration)
    assert (row["completed"], row["failed"]) == (0, 3) and "ttft_p50_ms" not in row


def test_bench_serve_against_a_server_it_starts(tmp_path, capsys):
    pytest.importorskip("openai")
    pytest.importorskip("minillm.entrypoints.background")
    out = tmp_path / "serve.json"
    main(["bench", "serve", "--num-prompts", "8", "--request-rate", "inf,20", "--input-len", "8:32",
          "--output-len", "4:12", "--goodput", "ttft:30000", "--max-num-seqs", "4", "--out", str(out)])
    assert "TTFT p50 ms" in capsys.readouterr().out
    result = json.loads(out.read_text())
    rows, summary = result["rows"], result["summary"]
    assert [row["request_rate"] for row in rows] == ["inf", 20.0]
    assert result["config"]["goodput"] == {"ttft": 30000.0} and "api_key" not in result["config"]
    for row in rows:
        assert (row["completed"], row["failed"]) == (8, 0)
        # ignore_eos and max_tokens: the server generated exactly the drawn lengths.
        assert row["total_output_tokens"] == summary["requested_output_tokens"]
        assert row["total_input_tokens"] == summary["requested_input_tokens"]
        assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] < row["e2el_p99_ms"]
        assert row["goodput"] == pytest.approx(row["request_throughput"])
