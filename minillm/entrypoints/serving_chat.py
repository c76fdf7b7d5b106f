"""POST /v1/chat/completions: the conversation rendered by the tokenizer's chat template (or the
server's --chat-template), then generated like a completion and returned as messages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import jinja2

from minillm.async_llm import AsyncLLM
from minillm.chat_utils import REFUSALS, apply_chat_template
from minillm.entrypoints.prompt_logprobs import prompt_logprobs_body
from minillm.entrypoints.protocol import ChatCompletionRequest
from minillm.entrypoints.serving_engine import Indexed, Prepared, chunk_usage, collect, deltas, now, prepare, usage
from minillm.outputs import CompletionOutput, Logprob


def check_template(tokenizer, chat_template: str) -> None:
    """ValueError where the server's --chat-template does not parse: found when the server starts,
    not at its first chat. Rendered once with a one-message conversation; what a template refuses
    at render time (roles that must alternate, ...) depends on the messages, so only its syntax is
    judged here."""
    if tokenizer is None:
        return
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "x"}], chat_template=chat_template, tokenize=False)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat_template does not parse: {e} (line {e.lineno})") from None
    except REFUSALS:
        pass


def render(tokenizer, request: ChatCompletionRequest, chat_template: str | None) -> dict:
    """The prompt (chat_utils.py); ValueError, a 400, where there is no tokenizer or template, or the
    template refuses the messages."""
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer; this server was started with skip_tokenizer_init")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: use /v1/completions, or start "
                         "the server with --chat-template FILE")
    return apply_chat_template(tokenizer, request.conversation(), chat_template, request.add_generation_prompt,
                               request.continue_final_message)


def prepare_chat(engine: AsyncLLM, request: ChatCompletionRequest, chat_template: str | None) -> Prepared:
    """The conversation rendered and tokenized, and its choices' parameters, checked; ValueError when invalid."""
    return prepare(engine, [render(engine.get_tokenizer(), request, chat_template)],
                   request.sampling_params(request.max_new_tokens(), request.num_logprobs()))


async def full_response(request: ChatCompletionRequest, request_id: str, prepared: Prepared, model: str,
                        outputs: AsyncIterator[Indexed]) -> dict | None:
    if (final := await collect(outputs, prepared.count)) is None:
        return None  # the client left
    choices = []
    for index in sorted(final):
        completion = final[index].outputs[0]
        choices.append({"index": index, "message": {"role": "assistant", "content": completion.text},
                        "logprobs": _logprobs(request, completion, 0), "finish_reason": completion.finish_reason,
                        "stop_reason": completion.stop_reason})
    # As vLLM's: the rendered prompt's scores, once for the response (its first choice computed them).
    prompt_logprobs = None if request.prompt_logprobs is None \
        else prompt_logprobs_body(final[0].prompt_logprobs, request.prompt_logprobs)
    return {"id": request_id, "object": "chat.completion", "created": now(), "model": model,
            "choices": choices, "usage": usage(final, request.n), "prompt_logprobs": prompt_logprobs}


async def stream_chunks(request: ChatCompletionRequest, request_id: str, prepared: Prepared, model: str,
                        outputs: AsyncIterator[Indexed]) -> AsyncIterator[dict]:
    """Each choice opens with the assistant's role, then its content in pieces; finish_reason on its
    last chunk; usage in a chunk of its own when asked for (and in every chunk, continuous_usage_stats)."""
    head = {"id": request_id, "object": "chat.completion.chunk", "created": now(), "model": model}

    def chunk(index: int, delta: dict, logprobs: dict | None = None, finish_reason: str | None = None,
              completion_tokens: int = 0) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {**head, "choices": [choice], **chunk_usage(request, prepared, index, completion_tokens)}

    for index in range(request.n):
        yield chunk(index, {"role": "assistant", "content": ""})
    last = {}
    async for index, out, text, offset in deltas(outputs):
        last[index] = out
        completion = out.outputs[0]
        yield chunk(index, {"content": text} if text else {}, _logprobs(request, completion, offset),
                    completion.finish_reason if out.finished else None, len(completion.token_ids))
    if request.include_usage:
        yield {**head, "choices": [], "usage": usage(last, request.n)}


def _logprobs(request: ChatCompletionRequest, completion: CompletionOutput, offset: int) -> dict | None:
    if not request.logprobs or not completion.logprobs:
        return None
    top = request.top_logprobs or 0

    def token(lp: Logprob) -> dict:
        text = lp.decoded_token or ""
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode())}

    content = []
    for entry in completion.logprobs[offset:]:
        sampled = next(iter(entry.values()))  # the sampled token comes first in each entry
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)[:top]
        content.append({**token(sampled), "top_logprobs": [token(lp) for lp in ranked]})
    return {"content": content}
