"""What `minillm bench serve` sends and when: seeded prompts of drawn lengths, Poisson arrivals, and
the parsing of its range, rate and SLO arguments (ValueError naming the argument on bad input)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SLO_METRICS = ("ttft", "tpot", "e2el")  # vLLM's --goodput names


@dataclass(frozen=True)
class Request:
    prompt: list[int]  # token ids: the server does not re-tokenize, so the input length is exact
    output_len: int  # max_tokens, reached exactly because end-of-text is ignored


def parse_range(text: str, name: str = "length") -> tuple[int, int]:
    """'32' -> (32, 32); '16:96' -> (16, 96), both ends included."""
    try:
        low, high = (int(part) for part in text.split(":")) if ":" in text else (int(text),) * 2
    except ValueError:
        raise ValueError(f"{name} must be N or LOW:HIGH (token counts), got {text!r}") from None
    if not 1 <= low <= high:
        raise ValueError(f"{name} must satisfy 1 <= LOW <= HIGH, got {text!r}")
    return low, high


def parse_rates(text: str) -> list[float]:
    """'1,2,4,inf' -> [1.0, 2.0, 4.0, inf]: requests per second, inf sending everything at once."""
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"request rate must be numbers or inf separated by commas, got {text!r}") from None
    if not all(rate > 0 for rate in rates):
        raise ValueError(f"request rate must be > 0 (or inf), got {text!r}")
    return rates


def parse_slo(text: str) -> tuple[str, float]:
    """'ttft:500' -> ('ttft', 500.0): a limit in milliseconds on one of SLO_METRICS."""
    name, _, value = text.partition(":")
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if name not in SLO_METRICS or not limit > 0:
        raise ValueError(f"goodput takes METRIC:MS with METRIC one of {', '.join(SLO_METRICS)} and MS > 0, "
                         f"got {text!r}")
    return name, limit


def rate_label(rate: float) -> str | float:
    """JSON has no infinity: the all-at-once rate is written "inf"."""
    return "inf" if math.isinf(rate) else rate


def build_workload(token_ids: list[int], num_prompts: int, input_len: tuple[int, int],
                   output_len: tuple[int, int], seed: int = 0, draw: int = 0) -> list[Request]:
    """Prompts cut from token_ids at random places; both lengths uniform over their ranges. Every
    draw has the same lengths, so the same work, but prompts cut elsewhere: a sweep gives each rate
    its own draw, so that the server's prefix cache does not serve one rate what another sent."""
    if input_len[1] >= len(token_ids):
        raise ValueError(f"input length {input_len[1]} must be below the corpus' {len(token_ids)} tokens")
    lengths = np.random.default_rng(seed)
    inputs = lengths.integers(input_len[0], input_len[1] + 1, size=num_prompts).tolist()
    outputs = lengths.integers(output_len[0], output_len[1] + 1, size=num_prompts).tolist()
    starts = np.random.default_rng([seed, draw]).integers(0, [len(token_ids) - n for n in inputs]).tolist()
    return [Request(token_ids[start:start + n], out) for start, n, out in zip(starts, inputs, outputs)]


def arrival_times(num_requests: int, rate: float, seed: int = 0) -> list[float]:
    """Seconds from the start at which each request is sent: the first at once, then exponential
    gaps of mean 1/rate (a Poisson process, how independent users arrive); all at 0 when rate is inf.
    One seed gives every rate the same pattern, scaled: a sweep then varies the rate alone."""
    if math.isinf(rate):
        return [0.0] * num_requests
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=max(num_requests - 1, 0))
    return [0.0] + np.cumsum(gaps).tolist()
