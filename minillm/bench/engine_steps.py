"""An engine stepped for a measurement: requests of random prompt tokens brought to their decode
steps, and a step's time taken whole (from an idle device, or back to back where async scheduling
overlaps steps), or its CUDA graph's alone (`bench decode`, `bench kernels`, `bench utilisation`,
the step profiler)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from minillm.bench import timing
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine


MIXED_REPEATS = 5  # timed mixed steps, each with `decoding`'s sequences and a prompt of its own


def random_prompt(vocab: int, length: int, seed: int) -> dict:
    return {"prompt_token_ids": torch.randint(1, vocab, (length,), generator=torch.Generator().manual_seed(seed))
            .tolist()}


def decode_len(batch: int, context: int, steps: int, max_num_batched_tokens: int) -> int:
    """The most tokens one of `decoding`'s sequences reaches: its prompt, the tokens it decodes while
    the batch's later prompts are prefilled, and `steps` more with a margin. The scheduler serves
    decodes first, so a step prefills what up to batch - 1 decodes leave of max_num_batched_tokens.
    An engine for `decoding` needs max_model_len and KV blocks for this many."""
    if max_num_batched_tokens <= batch:
        raise ValueError(f"max_num_batched_tokens must exceed the batch ({batch}) to prefill beside its decodes, "
                         f"got {max_num_batched_tokens}")
    prefill_steps = -(-batch * context // (max_num_batched_tokens - batch)) + 1
    return context + prefill_steps + steps + 8


@contextlib.contextmanager
def decoding(llm: LLM, batch: int, context: int, steps: int) -> Iterator[LLMEngine]:
    """The engine with `batch` requests of `context` random prompt tokens, each past its prefill and
    one decode step, that can take `steps` more pure decode steps of all `batch` sequences; the
    requests are aborted at the end. The prompts admitted first decode while the later ones are
    prefilled, so none may finish before the last one has: each may reach `decode_len` tokens."""
    engine = llm.llm_engine
    vocab = engine.model_config.vocab_size
    longest = decode_len(batch, context, steps, engine.scheduler.max_num_batched_tokens)
    if longest > engine.max_model_len:
        raise ValueError(f"{batch} sequences of {context} prompt tokens and {steps} decode steps need "
                         f"max_model_len >= {longest}, got {engine.max_model_len}")
    params = SamplingParams(temperature=0, max_tokens=longest - context, ignore_eos=True)
    ids = [f"decode-{batch}-{i}" for i in range(batch)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, random_prompt(vocab, context, i), params)
    try:
        while any(seq.num_output_tokens == 0 for seq in engine.scheduler.running) or engine.scheduler.waiting:
            engine.step()
        engine.step()  # the first decode of this batch size may compile kernels
        running = engine.scheduler.running
        if len(running) < batch or any(longest - seq.num_tokens <= steps for seq in running):
            raise RuntimeError(f"decoding: {len(running)} of {batch} sequences running, not all with room "
                               f"for {steps} steps: decode_len undercounts the steps of this batch's prefill")
        yield engine
    finally:
        for request_id in ids:
            engine.abort_request(request_id)


def _timed_step(engine: LLMEngine, from_idle: bool = True) -> float:
    """Seconds of one engine step, from an idle device unless not from_idle."""
    if from_idle and engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    engine.step()  # ends in sampled tokens read back to the host: a step is done on the device
    return time.perf_counter() - start


def decode_step_seconds(llm: LLM, batch: int, context: int, steps: int) -> tuple[list[float], float | None, float]:
    """Seconds of each of `steps` pure decode steps of `batch` sequences of `context` prompt tokens;
    the GPU seconds of the last one's graph replayed alone (None without one); and the sequences'
    mean length when the first of them began (the first prompts admitted have decoded further). With
    async scheduling the steps run back to back: each one's time is then what it adds to the run."""
    with decoding(llm, batch, context, steps) as engine:
        from_idle = not engine.config.scheduler.async_scheduling
        length = sum(seq.num_tokens for seq in engine.scheduler.running) / batch
        return [_timed_step(engine, from_idle) for _ in range(steps)], _replay_seconds(engine, batch), length


def _replay_seconds(engine: LLMEngine, batch: int) -> float | None:
    """The decode graph of `batch` sequences replayed on the inputs its last step left in the buffers
    (it stores the same K/V again and attends as that step did): the GPU's part of a step, without
    the host's work around it, which a whole step waits for."""
    graphs = engine.model_runner.cuda_graphs
    graph = graphs.graphs.get(graphs.descriptor([1] * batch, [1] * batch)) if graphs is not None else None
    return None if graph is None else timing.replay_time(graph)


def prefill_seconds(llm: LLM, tokens: int) -> float:
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    for repeat in range(3):
        engine.add_request(f"prefill-{tokens}-{repeat}", random_prompt(engine.model_config.vocab_size, tokens,
                                                                          repeat), params)
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def mixed_step_seconds(llm: LLM, decodes: int, chunk: int, context: int, repeats: int = MIXED_REPEATS) -> float:
    """Median seconds of a step that prefills a `chunk`-token prompt beside `decodes` sequences' decodes
    (what continuous batching runs at each admission)."""
    times = []
    with decoding(llm, decodes, context, repeats + 2) as engine:
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)  # done in the step that prefills it
        for i in range(repeats):
            engine.add_request(f"mixed-{i}", random_prompt(engine.model_config.vocab_size, chunk, 100 + i), params)
            times.append(_timed_step(engine))
    return sorted(times)[len(times) // 2]
