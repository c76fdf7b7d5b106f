"""What `generate` returns, shaped like vLLM's `RequestOutput` so course code runs on either."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int  # 1 = the most likely token
    decoded_token: str | None = None


@dataclass
class RequestMetrics:
    """Wall-clock times (time.time()) of a request's life, as vLLM reports them."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_in_queue(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # With SamplingParams.prompt_logprobs, once the prompt is computed: None for the first prompt
    # token (nothing precedes it), then an entry per token, the token itself first.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None

    def __repr__(self) -> str:
        out = self.outputs[0]
        text = out.text if len(out.text) <= 40 else out.text[:37] + "..."
        return (f"RequestOutput(request_id={self.request_id!r}, prompt_tokens={len(self.prompt_token_ids)}, "
                f"text={text!r}, output_tokens={len(out.token_ids)}, finish_reason={out.finish_reason!r})")
