"""A served workload replayed through the real engine on a virtual clock.

Requests arrive at given times; each engine step advances the clock by a cost model of its size,
`StepCost(fixed, per_token)`, fitted to measured steps (`fit_step_cost`) or taken from a GPU's
figures. The tokens are the engine's own; only time is modelled. So a scheduling policy's TTFT,
TPOT and goodput come out the same on every machine, which a grader and a chapter's claim need,
while the real server (`minillm bench serve`) measures the same policy in wall-clock time. The
policy is the engine's own: `LLM(model, scheduling_policy=...)` (engine/policy.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from minillm.bench.latency import percentile
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.trace import StepEvent
from minillm.sampling_params import RequestOutputKind, SamplingParams


@dataclass(frozen=True)
class StepCost:
    """Seconds a step takes: a fixed part (launches, reading the weights) and a part per token."""

    fixed: float
    per_token: float

    def __call__(self, num_tokens: int) -> float:
        return self.fixed + self.per_token * num_tokens

    def tokens_within(self, seconds: float) -> int:
        """The largest step that takes at most `seconds` (0 when even an empty one does not fit)."""
        return max(0, math.floor((seconds - self.fixed) / self.per_token + 1e-9))


def fit_step_cost(num_tokens: Sequence[int], seconds: Sequence[float]) -> StepCost:
    """Least squares through measured (tokens, seconds) pairs. Where steps cost about the same
    whatever their size (a small model on a GPU), noise can tilt the line down: a step never gets
    cheaper with more tokens, so the slope is at least 0."""
    n = len(num_tokens)
    mean_x, mean_y = sum(num_tokens) / n, sum(seconds) / n
    var = sum((x - mean_x) ** 2 for x in num_tokens)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(num_tokens, seconds)) / var)
    return StepCost(fixed=max(0.0, mean_y - slope * mean_x), per_token=slope)


@dataclass(frozen=True)
class TimedRequest:
    arrival: float  # seconds on the virtual clock
    prompt_token_ids: list[int]
    max_tokens: int  # generated exactly (end-of-text ignored), so every policy does the same work


@dataclass
class Timing:
    """One request on the virtual clock."""

    arrival: float
    first_token: float = math.nan
    finished: float = math.nan
    num_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        return (self.finished - self.first_token) / (self.num_tokens - 1) if self.num_tokens > 1 else math.nan


def workload(token_ids: Sequence[int], rate: float, duration: float, long_fraction: float,
             short: tuple[int, int, int], long: tuple[int, int, int], seed: int = 0) -> list[TimedRequest]:
    """Poisson arrivals at `rate` per second for `duration` seconds; a request is long (a big prompt,
    e.g. a document to summarize) with probability long_fraction, else short (a chat turn).
    short, long: (shortest prompt, longest prompt, tokens generated)."""
    rng = random.Random(seed)
    requests, now = [], rng.expovariate(rate)
    while now < duration:
        low, high, out = long if rng.random() < long_fraction else short
        length = rng.randint(low, high)
        start = rng.randrange(len(token_ids) - length)
        requests.append(TimedRequest(now, list(token_ids[start:start + length]), out))
        now += rng.expovariate(rate)
    return requests


def replay(engine: LLMEngine, requests: Sequence[TimedRequest], cost: StepCost) -> list[Timing]:
    """Every request through the engine; a step's tokens come out when it ends, `cost(its tokens)`
    after it began; an idle engine waits for the next arrival. Timings in the requests' order."""
    timings = {str(i): Timing(r.arrival) for i, r in enumerate(requests)}
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    step_tokens: list[int] = []

    def count(event: StepEvent) -> None:
        step_tokens.append(sum(s.prefill_tokens + s.decode_tokens for s in event.seqs))

    now, next_arrival = 0.0, 0
    engine.step_listeners.append(count)
    try:
        while next_arrival < len(order) or engine.has_unfinished_requests():
            if not engine.has_unfinished_requests():
                now = max(now, requests[order[next_arrival]].arrival)
            while next_arrival < len(order) and requests[order[next_arrival]].arrival <= now:
                i = order[next_arrival]
                params = SamplingParams(temperature=0, max_tokens=requests[i].max_tokens, ignore_eos=True,
                                        output_kind=RequestOutputKind.CUMULATIVE)
                engine.add_request(str(i), {"prompt_token_ids": requests[i].prompt_token_ids}, params)
                next_arrival += 1
            outputs = engine.step()
            if not step_tokens:  # requests are waiting, and the step scheduled none of them
                scheduler = engine.scheduler
                raise RuntimeError(f"the engine made no progress at t = {now:.3f} s with "
                                   f"{len(scheduler.waiting)} requests waiting: a token budget of "
                                   f"{scheduler.policy.token_budget(scheduler)} admits nobody")
            now += cost(step_tokens.pop())
            for out in outputs:
                timing = timings[out.request_id]
                if math.isnan(timing.first_token):
                    timing.first_token = now
                if out.finished:
                    timing.finished, timing.num_tokens = now, len(out.outputs[0].token_ids)
    finally:
        engine.step_listeners.remove(count)
    return [timings[str(i)] for i in range(len(requests))]


def summarize(timings: Sequence[Timing], slo: dict[str, float]) -> dict:
    """p50/p95 of TTFT and TPOT in ms, and goodput: requests per second of the run meeting every
    limit of slo (ttft, tpot in ms), and the fraction of requests that did."""
    done = [t for t in timings if not math.isnan(t.finished)]
    duration = max(t.finished for t in done) - min(t.arrival for t in timings)
    row = {"requests": len(timings), "completed": len(done)}
    for name in ("ttft", "tpot"):
        values = [getattr(t, name) * 1e3 for t in done if not math.isnan(getattr(t, name))]
        row.update({f"{name}_p{q}_ms": percentile(values, q) for q in (50, 95)})
    # A step that takes exactly the limit meets it: the 1e-6 ms absorbs the float sums of the clock.
    good = sum(all(not getattr(t, name) * 1e3 > limit + 1e-6 for name, limit in slo.items()) for t in done)
    row.update(goodput=good / duration, slo_attained=good / len(timings))
    return row
