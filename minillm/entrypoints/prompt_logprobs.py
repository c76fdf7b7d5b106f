"""vLLM's `prompt_logprobs` request field, in responses: the engine scores the prompt's tokens while it
prefills them (SamplingParams.prompt_logprobs), once per prompt, and each use of those scores (the
field itself, echo's logprobs) takes the alternatives it asked for."""

from __future__ import annotations

from minillm.outputs import Logprob


def top_logprobs(entry: dict[int, Logprob], k: int) -> dict[int, Logprob]:
    """An entry (its token first, then the most likely tokens) cut to its token and the k most likely:
    the engine scores a prompt once, with the most alternatives any use of those scores asks for."""
    token, *alternatives = entry.items()
    return dict([token, *((t, lp) for t, lp in alternatives if lp.rank <= k)])


def prompt_logprobs_body(entries: list[dict[int, Logprob] | None], k: int) -> list[dict[str, dict] | None]:
    """vLLM's `prompt_logprobs` in a response: null for the first prompt token (nothing precedes it), then
    for each token {token id: {logprob, rank, decoded_token}}, the token itself and the k most likely."""
    return [None if entry is None else
            {str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
             for t, lp in top_logprobs(entry, k).items()} for entry in entries]
