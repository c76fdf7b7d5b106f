"""POST /v1/completions: OpenAI's legacy completions, whole or streamed as server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from minillm.async_llm import AsyncLLM
from minillm.entrypoints.protocol import CompletionRequest
from minillm.entrypoints.serving_engine import Indexed, collect, deltas, fan_out, now, random_id, usage
from minillm.outputs import CompletionOutput, Logprob


def completion_outputs(engine: AsyncLLM, request: CompletionRequest,
                       arrival_time: float) -> tuple[str, int, AsyncIterator[Indexed]]:
    """The engine's requests for this body, queued: (response id, choices, outputs); ValueError when invalid."""
    request_id, prompts = random_id("cmpl"), request.prompts()
    outputs = fan_out(engine, request_id, prompts,
                      lambda j: request.sampling_params(request.max_tokens, request.logprobs, j), request.n,
                      arrival_time)
    return request_id, len(prompts) * request.n, outputs


async def full_response(request: CompletionRequest, request_id: str, count: int, model: str,
                        outputs: AsyncIterator[Indexed]) -> dict | None:
    """The response once every choice finished; None when the client left first."""
    if (final := await collect(outputs, count)) is None:
        return None
    choices = [_choice(i, final[i].outputs[0], final[i].outputs[0].text, 0, request) for i in sorted(final)]
    return {"id": request_id, "object": "text_completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(final, request.n)}


async def stream_chunks(request: CompletionRequest, request_id: str, model: str,
                        outputs: AsyncIterator[Indexed]) -> AsyncIterator[dict]:
    """A chunk per choice per step that added text, finish_reason on each choice's last one; usage
    in a chunk of its own when asked for."""
    head = {"id": request_id, "object": "text_completion", "created": now(), "model": model}
    extra = {"usage": None} if request.include_usage else {}
    last = {}
    async for index, out, text, offset in deltas(outputs):
        last[index] = out
        yield {**head, "choices": [_choice(index, out.outputs[0], text, offset, request, out.finished)], **extra}
    if request.include_usage:
        yield {**head, "choices": [], "usage": usage(last, request.n)}


def _choice(index: int, completion: CompletionOutput, text: str, offset: int, request: CompletionRequest,
            finished: bool = True) -> dict:
    """offset: the first token this text covers (a chunk carries the logprobs of its new tokens)."""
    logprobs = request.logprobs is not None and completion.logprobs
    return {"index": index, "text": text, "logprobs": _logprobs(completion.logprobs[offset:]) if logprobs else None,
            "finish_reason": completion.finish_reason if finished else None,
            "stop_reason": completion.stop_reason if finished else None}


def _logprobs(entries: list[dict[int, Logprob]]) -> dict:
    """The legacy format: parallel lists of tokens, their logprobs, and the top alternatives."""
    tokens, token_logprobs, top, offsets, position = [], [], [], [], 0
    for entry in entries:
        sampled = next(iter(entry.values()))  # the sampled token comes first in each entry
        tokens.append(sampled.decoded_token or "")
        token_logprobs.append(sampled.logprob)
        top.append({lp.decoded_token or "": lp.logprob for lp in entry.values()})
        offsets.append(position)
        position += len(sampled.decoded_token or "")
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}
