"""One request's state as it moves through the engine: its tokens, its progress, its outcome."""

from __future__ import annotations

import enum
from collections.abc import Iterable

import torch

from minillm.outputs import Logprob, RequestMetrics
from minillm.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt: str | None = None, prompt_token_ids: Iterable[int] = (),
                 params: SamplingParams | None = None, max_model_len: int = 4096,
                 eos_token_ids: frozenset[int] = frozenset(), generator: torch.Generator | None = None,
                 arrival_time: float = 0.0) -> None:
        """The defaults suit a sequence made by hand (tests, the course's exercises); the engine gives all."""
        self.request_id = request_id
        self.prompt = prompt
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.params = params = SamplingParams() if params is None else params
        budget = params.max_tokens if params.max_tokens is not None else max_model_len
        # The most tokens (prompt included) this sequence can ever hold: what a contiguous cache reserves.
        self.max_len = min(max_model_len, self.num_prompt_tokens + budget)
        self.eos_token_ids = frozenset() if params.ignore_eos else eos_token_ids
        self.generator = generator
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []  # paged cache: the pool blocks holding this sequence's K/V
        self.block_hashes: list[int] = []  # prefix-cache hashes of its full blocks, in order
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache instead of computed
        # Speculative decoding: tokens whose K/V a draft model holds in its own pool (spec_decode/draft_model.py).
        self.num_draft_computed_tokens = 0
        self.output_text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        # prompt_logprobs: the first prompt token has none; the others' entries join as prefill reaches them.
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if params.prompt_logprobs is not None else None)
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        # Incremental detokenisation window (see engine/output_processor.py); starting a few prompt tokens
        # back lets tokenizers that merge a leading space into the first word decode it correctly.
        self.prefix_offset = max(0, self.num_prompt_tokens - 5)
        self.read_offset = self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Whether prompt logprobs were asked for and some are still to come: until then no prompt
        token may be skipped, not even by the prefix cache (a cached token gets no logits)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    def prompt_tokens_to_score(self, start: int, num_tokens: int) -> range:
        """The prompt tokens that positions start, ..., start + num_tokens - 1 score (token i by the
        logits at position i - 1) and that were not scored yet: a run that ends with the range, or just
        before the prompt's last position (whose logits sample). A position computed again after a
        preemption is not scored twice. Where they start follows from the positions, not from the
        entries received so far: with async scheduling this step is prepared before the step before it,
        which scores the tokens just before these, has been read."""
        if self.prompt_logprobs is None:
            return range(0)
        first = max(start, len(self.prompt_logprobs) - 1) + 1
        return range(first, max(first, min(start + num_tokens, self.num_prompt_tokens - 1) + 1))

    def banned_token_ids(self, offset: int = 0) -> list[int]:
        """Tokens that may not be sampled yet, offset tokens past the end: end-of-sequence tokens
        before min_tokens."""
        if self.num_output_tokens + offset >= self.params.min_tokens:
            return []
        return sorted(self.eos_token_ids.union(self.params.stop_token_ids))

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"output={self.num_output_tokens}, computed={self.num_computed_tokens})")
