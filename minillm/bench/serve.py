"""`minillm bench serve`: an OpenAI-compatible server under load, measured from the client side over
real HTTP with streaming, as `vllm bench serve` measures it.

Requests arrive as a Poisson process at each request rate of a sweep (or all at once at rate inf),
optionally at most `max_concurrency` in flight; each streams its completion and is timed chunk by
chunk on the client's clock:

- TTFT: from sending the request to the first chunk that carries tokens (the wait a user feels);
- ITL: the gaps between successive such chunks (a chunk may carry several tokens);
- TPOT: (end-to-end - TTFT) / (output tokens - 1), output tokens counted by the server's usage chunk;
- goodput: completed requests per second that met every limit of an SLO (vLLM's definition); without
  an SLO it is left out, since every completed request would count and it would repeat req/s.

End-of-text is ignored and max_tokens set to each request's drawn length, so every server, and every
rate, does the same work. A failed request is counted as failed, never ends the run.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from minillm.bench.latency import percentile
from minillm.bench.serve_workload import Request, arrival_times, build_workload, rate_label

PERCENTILES = (50, 95, 99)
COLUMNS = [("request_rate", "rate req/s"), ("completed", "completed"), ("failed", "failed"),
           ("request_throughput", "req/s"), ("output_throughput", "out tok/s"),
           ("total_token_throughput", "total tok/s"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
           ("tpot_p50_ms", "TPOT p50 ms"), ("tpot_p99_ms", "TPOT p99 ms"), ("itl_p50_ms", "ITL p50 ms"),
           ("itl_p99_ms", "ITL p99 ms"), ("goodput", "goodput req/s")]


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds from sending it."""

    input_len: int
    output_len: int  # as requested
    success: bool = False
    output_tokens: int = 0  # as the server's usage chunk counted them
    ttft: float = math.nan
    itl: list[float] = field(default_factory=list)
    e2el: float = math.nan
    error: str = ""

    @property
    def tpot(self) -> float:
        return (self.e2el - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else math.nan


def meets_slo(result: RequestResult, slo: dict[str, float]) -> bool:
    """slo: limits in milliseconds by metric name (ttft, tpot, e2el). A one-token request has no
    TPOT, and so nothing to miss it by (NaN compares false)."""
    return all(not getattr(result, name) * 1e3 > limit for name, limit in slo.items())


def summarize(results: list[RequestResult], duration: float, slo: dict[str, float] | None = None) -> dict:
    """One rate's figures: counts, throughputs over `duration` seconds, and the mean and percentiles
    of each latency in milliseconds (keys like ttft_p99_ms; absent when no request completed)."""
    done = [r for r in results if r.success]
    input_tokens, output_tokens = sum(r.input_len for r in done), sum(r.output_tokens for r in done)
    row = {"completed": len(done), "failed": len(results) - len(done), "duration_s": duration,
           "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
           "request_throughput": len(done) / duration, "output_throughput": output_tokens / duration,
           "total_token_throughput": (input_tokens + output_tokens) / duration}
    latencies = {"ttft": [r.ttft for r in done], "tpot": [r.tpot for r in done],
                 "itl": [gap for r in done for gap in r.itl], "e2el": [r.e2el for r in done]}
    for name, values in latencies.items():
        values = [v for v in values if not math.isnan(v)]
        if values:
            row[f"{name}_mean_ms"] = sum(values) / len(values) * 1e3
            row.update({f"{name}_p{q}_ms": percentile(values, q) * 1e3 for q in PERCENTILES})
    if slo:
        row["goodput"] = sum(meets_slo(r, slo) for r in done) / duration
    return row


async def send_request(client, model: str, request: Request) -> RequestResult:
    """Stream one completion; client: an openai.AsyncOpenAI."""
    result = RequestResult(len(request.prompt), request.output_len)
    start = last = time.perf_counter()
    try:
        stream = await client.completions.create(
            model=model, prompt=request.prompt, max_tokens=request.output_len, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:  # the usage chunk has none
                if math.isnan(result.ttft):
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
            if chunk.usage is not None:
                result.output_tokens = chunk.usage.completion_tokens
    except Exception as e:  # refused, a status error, an error inside the stream: this request failed
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2el = time.perf_counter() - start
    result.success = not math.isnan(result.ttft) and result.output_tokens > 0
    result.error = "" if result.success else "the stream had no tokens or no usage chunk"
    return result


async def run_rate(client, model: str, workload: list[Request], rate: float, max_concurrency: int | None = None,
                   seed: int = 0) -> tuple[list[RequestResult], float]:
    """Send the workload at `rate` requests/s (Poisson; inf: all at once), at most max_concurrency in
    flight; (results in workload order, seconds from the first request sent to the last finished)."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def arrive(request: Request, at: float) -> RequestResult:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        if limit is None:
            return await send_request(client, model, request)
        async with limit:  # an arrival past the cap waits; its TTFT counts from when it is sent
            return await send_request(client, model, request)

    times = arrival_times(len(workload), rate, seed)
    start = time.perf_counter()
    results = await asyncio.gather(*(arrive(request, at) for request, at in zip(workload, times)))
    return list(results), time.perf_counter() - start


async def sweep(base_url: str, model: str, workloads: list[list[Request]], rates: list[float], *,
                warmup: Request, api_key: str | None = None, max_concurrency: int | None = None,
                slo: dict[str, float] | None = None, seed: int = 0) -> list[dict]:
    """One row per rate, workloads[i] sent at rates[i], after one warmup request that must succeed."""
    from openai import AsyncOpenAI

    # Retries would hide failures and stretch latencies; "EMPTY" is what a server without a key ignores.
    async with AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", max_retries=0) as client:
        first = await send_request(client, model, warmup)
        if not first.success:
            raise ValueError(f"the server at {base_url} failed a test request for model {model!r}: {first.error}")
        rows = []
        for rate, workload in zip(rates, workloads):
            results, duration = await run_rate(client, model, workload, rate, max_concurrency, seed)
            rows.append({"request_rate": rate_label(rate), **summarize(results, duration, slo)})
    return rows


async def bench_serve(model: str = "tiny", *, base_url: str | None = None, api_key: str | None = None,
                      num_prompts: int = 64, input_len: tuple[int, int] = (16, 128),
                      output_len: tuple[int, int] = (16, 64), request_rates: Sequence[float] = (math.inf,),
                      max_concurrency: int | None = None, slo: dict[str, float] | None = None, seed: int = 0,
                      **engine_args) -> tuple[list[dict], dict]:
    """(rows, summary). base_url: a running server (http://host:port, /v1 optional); without it one
    is started in this process with engine_args (as `LLM`'s) for the length of the run. model
    names the served model and the tokenizer the prompts are cut with."""
    from minillm.eval.heldout import eval_token_ids
    from minillm.models.loader import load_tokenizer, resolve_model_path

    if num_prompts < 1 or (max_concurrency is not None and max_concurrency < 1):
        raise ValueError(f"num_prompts and max_concurrency must be >= 1, got {num_prompts} and {max_concurrency}")
    token_ids = eval_token_ids(load_tokenizer(resolve_model_path(model)))
    rates = list(request_rates)
    workloads = [build_workload(token_ids, num_prompts, input_len, output_len, seed, draw=i)
                 for i in range(len(rates))]
    warmup = build_workload(token_ids, 1, input_len, output_len, seed, draw=len(rates))[0]
    options = {"warmup": warmup, "api_key": api_key, "max_concurrency": max_concurrency, "slo": slo, "seed": seed}
    if base_url is not None:
        rows = await sweep(base_url.rstrip("/").removesuffix("/v1") + "/v1", model, workloads, rates, **options)
    else:
        from minillm.entrypoints.background import BackgroundServer

        with BackgroundServer(model, api_key=api_key, **engine_args) as server:
            rows = await sweep(server.base_url, model, workloads, rates, **options)
    summary = {"num_prompts": num_prompts, "requested_input_tokens": sum(len(r.prompt) for r in workloads[0]),
               "requested_output_tokens": sum(r.output_len for r in workloads[0]),
               "failed": sum(row["failed"] for row in rows),
               "max_output_throughput": max(row["output_throughput"] for row in rows)}
    if slo:
        summary["max_goodput"] = max(row["goodput"] for row in rows)
    return rows, summary
