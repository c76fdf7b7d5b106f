"""What completions and chat share: one HTTP request queued as engine requests (one per prompt, each
with its n choices: engine/parallel_sampling.py), their outputs merged back in arrival order, choice by
choice, and the client watched so that one who leaves takes its requests with it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request

from minillm.async_llm import AsyncLLM
from minillm.entrypoints.errors import error_body
from minillm.entrypoints.protocol import SamplingRequest
from minillm.outputs import RequestOutput
from minillm.sampling_params import SamplingParams

Indexed = tuple[int, RequestOutput]  # (choice index, that choice's output)
# Completions one HTTP request may ask for, prompts times n, each a request in the engine: OpenAI's
# own bound on the prompts of one request. A few bytes of body must not queue tens of thousands.
MAX_COMPLETIONS = 2048


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class Prepared:
    """One HTTP request, checked and tokenized: its prompts (text and token ids) and the parameters of
    their choices. Choice j of prompt p is the response's choice p * n + j."""

    prompts: list[dict]
    params: SamplingParams
    echoes: list | None = None  # completions with echo: each prompt as sent back (echo.Echo)

    @property
    def count(self) -> int:
        return len(self.prompts) * self.params.n


def prepare(engine: AsyncLLM, prompts: list[dict], params: SamplingParams) -> Prepared:
    """Tokenizes each prompt once for its n choices and checks everything: ValueError when anything is
    invalid, before anything is queued. It takes time that grows with the prompt, so the server runs it
    off the event loop (in a thread; the tokenizer releases the GIL)."""
    if len(prompts) * params.n > MAX_COMPLETIONS:
        raise ValueError(f"prompt and n ask for {len(prompts)} x {params.n} = {len(prompts) * params.n} completions; "
                         f"a request may ask for at most {MAX_COMPLETIONS} (send the rest in other requests)")
    tokenized = []
    for prompt in prompts:
        text, token_ids = engine.llm_engine.input_processor.process_prompt(prompt)
        tokenized.append({"prompt": text, "prompt_token_ids": token_ids})
    engine.llm_engine.input_processor.check_params(params)
    for prompt in tokenized:
        check_fits_context(len(prompt["prompt_token_ids"]), params.max_tokens, engine.llm_engine.max_model_len)
    return Prepared(tokenized, params)


def fan_out(engine: AsyncLLM, request_id: str, prepared: Prepared, arrival_time: float) -> AsyncIterator[Indexed]:
    """Queue every prompt and merge their choices' outputs. arrival_time: when the HTTP request reached
    the server (its TTFT counts from there)."""
    queued = [(f"{request_id}-{p}", prompt) for p, prompt in enumerate(prepared.prompts)]
    streams = {p: engine.add_request(rid, prompt, prepared.params, arrival_time)
               for p, (rid, prompt) in enumerate(queued)}
    return _merge(engine, streams, prepared.params.n, [rid for rid, _ in queued])


def check_fits_context(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """Refuses, as vLLM's and OpenAI's servers do, a request whose prompt and max_tokens together pass
    the context; the offline LLM.generate stops such a request at the context's end instead."""
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        raise ValueError(f"the model's context length (max_model_len) is {max_model_len} tokens, but the prompt has "
                         f"{num_prompt_tokens} tokens and max_tokens asks for {max_tokens} more: max_tokens must be "
                         f"at most {max_model_len - num_prompt_tokens} for this prompt")


async def _merge(engine: AsyncLLM, streams: dict[int, AsyncIterator[RequestOutput]], n: int,
                 request_ids: list[str]) -> AsyncIterator[Indexed]:
    """Each prompt's outputs, choice by choice: an output holds one choice when streamed, all n at the
    end otherwise; each choice's own output is finished once that choice is."""
    merged = asyncio.Queue()

    async def pump(p: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                merged.put_nowait((p, out))
        except Exception as e:
            merged.put_nowait((p, e))

    tasks = [asyncio.create_task(pump(p, stream)) for p, stream in streams.items()]
    try:
        remaining = len(tasks)
        while remaining:
            p, item = await merged.get()
            if isinstance(item, Exception):
                raise item
            remaining -= item.finished
            for completion in item.outputs:
                yield p * n + completion.index, dataclasses.replace(item, outputs=[completion],
                                                                    finished=completion.finished())
    finally:
        for task in tasks:
            task.cancel()
        # A pump cancelled before it started never opened its stream, so abort by id too.
        for request_id in request_ids:
            engine.abort(request_id)


async def until_disconnected(request: Request) -> None:
    """Returns when the client goes away; the body has been read, so only http.disconnect is left."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def while_connected(request: Request, outputs: AsyncIterator[Indexed]) -> AsyncIterator[Indexed]:
    """outputs until the client disconnects; closing them then aborts the engine's requests at once,
    even those still waiting for their first token (nothing was being sent that could fail)."""
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        while True:
            step = asyncio.ensure_future(anext(outputs))
            await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()  # its generator stops where it waits, and aborts its requests
                with contextlib.suppress(asyncio.CancelledError):
                    await step
                return
            try:
                yield step.result()
            except StopAsyncIteration:
                return
    finally:
        gone.cancel()
        await outputs.aclose()


def usage(outputs: dict[int, RequestOutput], n: int) -> dict:
    """Prompt tokens count once per prompt, completion tokens once per choice."""
    prompt = sum(len(out.prompt_token_ids) for index, out in outputs.items() if index % n == 0)
    completion = sum(len(out.outputs[0].token_ids) for out in outputs.values())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chunk_usage(request: SamplingRequest, prepared: Prepared, index: int, completion_tokens: int) -> dict:
    """The usage field of a streamed chunk of choice `index`: none unless include_usage, then null (the
    total comes in a chunk of its own), or with continuous_usage_stats the choice's tokens so far."""
    if not request.include_usage:
        return {}
    if not request.continuous_usage:
        return {"usage": None}
    prompt = len(prepared.prompts[index // request.n]["prompt_token_ids"])
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                      "total_tokens": prompt + completion_tokens}}


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def now() -> int:
    return int(time.time())


async def collect(outputs: AsyncIterator[Indexed], count: int) -> dict[int, RequestOutput] | None:
    """Every choice's final output; None when the client left before all of them finished."""
    final = {index: out async for index, out in outputs}
    return final if len(final) == count and all(out.finished for out in final.values()) else None


async def deltas(outputs: AsyncIterator[Indexed]) -> AsyncIterator[tuple[int, RequestOutput, str, int]]:
    """(index, output, its new text, its first new token) for each output that adds text or finishes."""
    sent_text: dict[int, int] = {}
    sent_tokens: dict[int, int] = {}
    async for index, out in outputs:
        completion = out.outputs[0]
        text, offset = completion.text[sent_text.get(index, 0):], sent_tokens.get(index, 0)
        if text or out.finished:
            sent_text[index], sent_tokens[index] = len(completion.text), len(completion.token_ids)
            yield index, out, text, offset


async def event_stream(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events ending in [DONE]; an engine that dies mid-stream is reported in the stream."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except Exception as e:
        yield sse(error_body(503, str(e)))
    yield sse("[DONE]")
