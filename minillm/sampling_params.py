"""How to pick each next token, and when to stop: vLLM's `SamplingParams`, same names and meaning.

Filters apply in vLLM's order: temperature, then min_p, then top_k, then top_p.
- temperature 0 is greedy (argmax); otherwise logits are divided by it before the softmax.
- min_p keeps tokens whose probability is at least min_p times the most likely token's.
- top_k keeps the k most likely tokens; tokens tied with the k-th are kept too.
- top_p keeps the smallest set of most likely tokens whose probability sums to at least top_p.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

GREEDY_EPS = 1e-5


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # an output after every step, with everything generated so far (streaming)
    FINAL_ONLY = 1  # one output, when the request finishes (what LLM.generate asks for)


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) keeps every token
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: until the model's context is full
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _number("temperature", self.temperature)
        _number("top_p", self.top_p)
        _number("min_p", self.min_p)
        _integer("top_k", self.top_k)
        _integer("min_tokens", self.min_tokens)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (disabled) or at least 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens is not None:
            _integer("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        if self.seed is not None:
            _integer("seed", self.seed)
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs)
            if self.logprobs < 0:
                raise ValueError(f"logprobs must be >= 0 (or None), got {self.logprobs}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        self.stop_strings = stops
        ids = list(self.stop_token_ids or [])
        if not all(isinstance(i, int) and i >= 0 for i in ids):
            raise ValueError(f"stop_token_ids must be non-negative token ids, got {self.stop_token_ids!r}")
        self.stop_token_ids = ids
        if self.top_k == -1:
            self.top_k = 0
        if self.greedy:
            # As in vLLM: the filters mean nothing for an argmax, so they are switched off.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


def _number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")


def _integer(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
