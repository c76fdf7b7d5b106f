"""`echo` for /v1/completions: the prompt sent back before the completion, with its tokens'
log-probabilities when `logprobs` is asked for. This is how lm-evaluation-harness scores a
continuation (its loglikelihood tasks): it sends context + continuation as the prompt with echo,
logprobs=1 and max_tokens 0 or 1, and sums the continuation's token logprobs.

The log-probabilities are the engine's prompt_logprobs (SamplingParams), computed while it prefills
the prompt: each prompt token after the first gets its logprob given the tokens before it, its rank,
and the most likely tokens there, raw (from the model's logits, before any penalty).
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.async_llm import AsyncLLM


@dataclass
class Echo:
    """One prompt as sent back: its text, and its first token (which has no logprob: nothing
    precedes it); the other tokens' logprobs come with the engine's output (prompt_logprobs)."""

    text: str
    first_token: str


def echo_prompt(engine: AsyncLLM, prompt: dict) -> Echo:
    """prompt: {"prompt": text or None, "prompt_token_ids": [...]}, as prepared for the engine."""
    if (tokenizer := engine.get_tokenizer()) is None:
        raise ValueError("echo needs a tokenizer; this server was started with skip_tokenizer_init")
    ids = prompt["prompt_token_ids"]
    text = prompt["prompt"] if prompt["prompt"] is not None else tokenizer.decode(ids)
    return Echo(text, tokenizer.decode(ids[:1]))
