"""POST /v1/completions: OpenAI's legacy completions, whole or streamed as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from minillm.async_llm import AsyncLLM
from minillm.entrypoints.echo import Echo, echo_prompt
from minillm.entrypoints.prompt_logprobs import prompt_logprobs_body, top_logprobs
from minillm.entrypoints.protocol import CompletionRequest
from minillm.entrypoints.serving_engine import Indexed, Prepared, chunk_usage, collect, deltas, now, prepare, usage
from minillm.outputs import CompletionOutput, Logprob


def prepare_completion(engine: AsyncLLM, request: CompletionRequest) -> Prepared:
    """The body's prompts tokenized and its choices' parameters, checked, and with echo each prompt
    as sent back; ValueError when invalid. max_tokens 0 with echo generates one token, never shown."""
    if request.max_tokens == 0 and not request.echo:
        raise ValueError("max_tokens must be at least 1; 0 (the prompt alone, scored) needs echo: true")
    max_tokens = 1 if request.echo and request.max_tokens == 0 else request.max_tokens

    prepared = prepare(engine, request.prompts(), request.sampling_params(max_tokens, request.logprobs))
    if request.echo:
        prepared.echoes = [echo_prompt(engine, prompt) for prompt in prepared.prompts]
    return prepared


async def full_response(request: CompletionRequest, request_id: str, prepared: Prepared, model: str,
                        outputs: AsyncIterator[Indexed]) -> dict | None:
    """The response once every choice finished; None when the client left first."""
    if (final := await collect(outputs, prepared.count)) is None:
        return None
    if prepared.echoes is not None and request.max_tokens == 0:
        # The prompt alone: the token generated to get here is dropped.
        for out in final.values():
            out.outputs[0] = CompletionOutput(0, "", [], None, [] if request.logprobs is not None else None,
                                              "length")
    choices = []
    for i in sorted(final):
        scores = final[i - i % request.n].prompt_logprobs  # the prompt's, scored with its first choice
        choice = _choice(i, final[i].outputs[0], final[i].outputs[0].text, 0, request) if prepared.echoes is None \
            else _echoed(i, final[i].outputs[0], prepared.echoes[i // request.n], scores, request)
        choice["prompt_logprobs"] = None if request.prompt_logprobs is None \
            else prompt_logprobs_body(scores, request.prompt_logprobs)
        choices.append(choice)
    return {"id": request_id, "object": "text_completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(final, request.n)}


async def stream_chunks(request: CompletionRequest, request_id: str, prepared: Prepared, model: str,
                        outputs: AsyncIterator[Indexed]) -> AsyncIterator[dict]:
    """A chunk per choice per step that added text, finish_reason on each choice's last one; usage
    in a chunk of its own when asked for (and in every chunk, continuous_usage_stats)."""
    head = {"id": request_id, "object": "text_completion", "created": now(), "model": model}
    last = {}
    async for index, out, text, offset in deltas(outputs):
        last[index] = out
        completion = out.outputs[0]
        yield {**head, "choices": [_choice(index, completion, text, offset, request, out.finished)],
               **chunk_usage(request, prepared, index, len(completion.token_ids))}
    if request.include_usage:
        yield {**head, "choices": [], "usage": usage(last, request.n)}


def _choice(index: int, completion: CompletionOutput, text: str, offset: int, request: CompletionRequest,
            finished: bool = True) -> dict:
    """offset: the first token this text covers (a chunk carries the logprobs of its new tokens)."""
    logprobs = request.logprobs is not None and completion.logprobs
    return {"index": index, "text": text, "logprobs": _logprobs(completion.logprobs[offset:]) if logprobs else None,
            "finish_reason": completion.finish_reason if finished else None,
            "stop_reason": completion.stop_reason if finished else None}


def _echoed(index: int, completion: CompletionOutput, echo: Echo,
            prompt_logprobs: list[dict[int, Logprob] | None] | None, request: CompletionRequest) -> dict:
    """A choice whose text and logprobs start with its prompt's (prompt_logprobs: the engine's, with
    None for the first token)."""
    choice = _choice(index, completion, echo.text + completion.text, 0, request)
    if request.logprobs is not None:
        # The prompt may have been scored with more alternatives, for prompt_logprobs.
        prompt = [top_logprobs(entry, request.logprobs) for entry in prompt_logprobs[1:]]
        choice["logprobs"] = _logprobs(prompt + completion.logprobs, echo.first_token)
    return choice


def _logprobs(entries: list[dict[int, Logprob]], first_token: str | None = None) -> dict:
    """The legacy format: parallel lists of tokens, their logprobs, and the top alternatives.
    first_token: an echoed prompt's first token, which has neither logprob nor alternatives (null)."""
    tokens, token_logprobs, top, offsets, position = [], [], [], [], 0
    if first_token is not None:
        tokens, token_logprobs, top, offsets, position = [first_token], [None], [None], [0], len(first_token)
    for entry in entries:
        sampled = next(iter(entry.values()))  # the sampled token comes first in each entry
        tokens.append(sampled.decoded_token or "")
        token_logprobs.append(sampled.logprob)
        top.append({lp.decoded_token or "": lp.logprob for lp in entry.values()})
        offsets.append(position)
        position += len(sampled.decoded_token or "")
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}
