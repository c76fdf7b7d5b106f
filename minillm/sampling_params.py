"""How to pick each next token, and when to stop: vLLM's `SamplingParams`, same names and meaning.

Penalties change the logits first (sample/penalties.py): presence_penalty and frequency_penalty
(OpenAI's, on the output's tokens) and repetition_penalty (vLLM's, on the prompt's and the output's).
Filters apply next, in vLLM's order: temperature, then min_p, then top_k, then top_p.
- temperature 0 is greedy (argmax); otherwise logits are divided by it before the softmax.
- min_p keeps tokens whose probability is at least min_p times the most likely token's.
- top_k keeps the k most likely tokens; tokens tied with the k-th are kept too.
- top_p keeps the smallest set of most likely tokens whose probability sums to at least top_p.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

GREEDY_EPS = 1e-5
MAX_INT32 = 2**31 - 1  # token counts, top_k and token ids: far past any context or vocabulary
# torch.Generator.manual_seed takes any signed or unsigned 64-bit seed (vLLM's server bounds it the same way)
MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
MAX_N = 128  # completions of one prompt, as OpenAI caps n: each is a request in the engine
FLOAT32_MAX = 3.4028234663852886e38  # the sampler holds temperatures as float32
MAX_PENALTY = 2.0  # presence and frequency penalties, OpenAI's and vLLM's range [-2, 2]
# A repetition penalty divides or multiplies logits: bounded so that a logit stays finite (vLLM only asks > 0).
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
SMALLEST_POSITIVE = math.ulp(0.0)  # x >= it is x > 0, for floats and ints alike
# Stop strings and stop token ids, each: every step of the request scans them, and with it every
# request sharing the step waits (far past what any use needs).
MAX_STOPS = 1024


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0  # an output after every step, with everything generated so far (streaming)
    FINAL_ONLY = 1  # one output, when the request finishes (what LLM.generate asks for)


@dataclass
class SamplingParams:
    # Completions of the prompt (parallel sampling, engine/parallel_sampling.py): completion j samples
    # with seed + j when a seed is given, as in vLLM.
    n: int = 1
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
    # Each prompt token after the first scored by the model: its logprob and the top prompt_logprobs
    # alternatives (vLLM's; RequestOutput.prompt_logprobs).
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # Keep what stopped the request at the end of its text: the stop string, or the stop token's (EOS or
    # one of stop_token_ids) own text, which is otherwise left out, as vLLM does.
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1: none
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.verify()

    def verify(self) -> None:
        """Check every field and normalize it: at construction, and again by the engine before a request
        is queued (`LLMEngine.check_params`), since a field may have been set since."""
        # Every number is bounded to what the sampler's tensors and torch.Generator hold: a value past
        # them would fail the step it is sampled in, and with it every request sharing that step.
        _number("temperature", self.temperature, 0, FLOAT32_MAX, f"finite and in [0, {FLOAT32_MAX}] (0 means greedy)")
        _number("top_p", self.top_p, SMALLEST_POSITIVE, 1, "in (0, 1]")
        _number("min_p", self.min_p, 0, 1, "in [0, 1]")
        _integer("top_k", self.top_k, -1, MAX_INT32, f"0 or -1 (disabled) or in [1, {MAX_INT32}]")
        for name in ("presence_penalty", "frequency_penalty"):
            _number(name, getattr(self, name), -MAX_PENALTY, MAX_PENALTY, f"in [-{MAX_PENALTY}, {MAX_PENALTY}]")
        _number("repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY,
                f"in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY}] (1 means none)")
        if self.max_tokens is not None:
            _integer("max_tokens", self.max_tokens, 1, MAX_INT32)
        _integer("min_tokens", self.min_tokens, 0, MAX_INT32)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        _integer("n", self.n, 1, MAX_N)
        if self.seed is not None:
            _integer("seed", self.seed, MIN_SEED, MAX_SEED - self.n + 1,
                     f"in [{MIN_SEED}, {MAX_SEED - self.n + 1}] with n={self.n} (completion j samples with seed + j)"
                     if self.n > 1 else None)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 0, MAX_LOGPROBS)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise TypeError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r:.40}")
        stops = [self.stop] if isinstance(self.stop, str) else _listed("stop", self.stop)
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r:.80}")
        self.stop_strings = stops
        ids = _listed("stop_token_ids", self.stop_token_ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_INT32 for i in ids):
            raise ValueError(f"stop_token_ids must be token ids in [0, {MAX_INT32}], got {self.stop_token_ids!r:.80}")
        self.stop_token_ids = ids
        if self.top_k == -1:
            self.top_k = 0
        if self.greedy:
            # As in vLLM: the filters mean nothing for an argmax, so they are switched off.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _listed(name: str, value) -> list:
    """A list or tuple (None: empty) of at most MAX_STOPS entries, as a new list."""
    if value is not None and not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list, got {type(value).__name__} {value!r:.40}")
    if value is not None and len(value) > MAX_STOPS:
        raise ValueError(f"{name} must have at most {MAX_STOPS} entries, got {len(value)}")
    return list(value or [])


def _number(name: str, value, low: float, high: float, accepted: str) -> None:
    """A number (not a bool) within [low, high]; NaN and infinities fail the comparison, so are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r:.40}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {accepted}, got {value!r:.40}")


def _integer(name: str, value, low: int, high: int, accepted: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r:.40}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be {accepted or f'in [{low}, {high}]'}, got {value}")
