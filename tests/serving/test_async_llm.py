"""AsyncLLM: many asyncio callers on one engine thread; a caller that leaves aborts its request."""

from __future__ import annotations

import asyncio
import time

import pytest

from minillm import LLM, SamplingParams
from minillm.async_llm import AsyncLLM, EngineDeadError

ENGINE = {"dtype": "float32", "max_model_len": 256, "max_num_seqs": 4}
PROMPTS = [f"def f{i}(x):" for i in range(10)]


def test_concurrent_callers_get_what_generate_gives_and_leavers_free_their_blocks():
    engine = AsyncLLM("tiny", **ENGINE)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    expected = [o.outputs[0].text for o in LLM("tiny", **ENGINE).generate(PROMPTS, greedy, use_tqdm=False)]

    async def final_text(i: int) -> str:
        outs = [out async for out in engine.generate(PROMPTS[i], greedy, f"r{i}")]
        return outs[-1].outputs[0].text

    async def leaves_early(i: int) -> int:
        async for out in engine.generate(PROMPTS[i], SamplingParams(max_tokens=200, ignore_eos=True), f"b{i}"):
            if len(out.outputs[0].token_ids) >= 3:
                return len(out.outputs[0].token_ids)  # break out of the stream: the request is aborted

    async def main():
        texts = await asyncio.gather(*(final_text(i) for i in range(10)))
        waiting = asyncio.create_task(final_text(0))  # cancelled, maybe before its first token
        left = await asyncio.gather(*(leaves_early(i) for i in range(6)))
        waiting.cancel()
        with pytest.raises(ValueError, match="max_model_len"):
            engine.add_request("long", {"prompt_token_ids": [1] * 300}, greedy)
        await asyncio.sleep(0.5)  # the aborts run between two steps
        return texts, left, await engine.get_metrics()

    try:
        texts, left, metrics = asyncio.run(main())
    finally:
        engine.shutdown()
    assert texts == expected and all(n >= 3 for n in left)
    blocks = engine.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks and not engine.llm_engine.has_unfinished_requests()
    aborted = [m.value for m in metrics if m.name == "vllm:request_success" and m.labels["finished_reason"] == "abort"]
    assert aborted and aborted[0] >= 6


def test_a_failing_step_fails_every_caller_and_later_ones():
    engine = AsyncLLM("tiny", **ENGINE)

    def broken():
        raise RuntimeError("device lost")

    engine.llm_engine.step = broken

    async def one(i: int):
        async for _ in engine.generate(PROMPTS[i], SamplingParams(max_tokens=4), f"r{i}"):
            pass

    async def main():
        return await asyncio.gather(*(one(i) for i in range(3)), return_exceptions=True)

    errors = asyncio.run(main())
    assert all(isinstance(e, EngineDeadError) and "device lost" in str(e) for e in errors)
    assert engine.errored and not engine.is_running
    with pytest.raises(EngineDeadError):
        asyncio.run(one(0))
    engine.shutdown()  # idempotent on a dead engine


def test_a_request_whose_sampling_tensors_cannot_be_built_fails_alone():
    engine = AsyncLLM("tiny", **ENGINE)
    bad = SamplingParams(temperature=1.0, max_tokens=4)
    bad.top_k = 2**63  # set after validation: no value of one request may stop the engine loop

    unlisted = SamplingParams(max_tokens=4)
    unlisted.stop_token_ids = 7  # the output processor's `in` would raise inside the engine loop

    async def main():
        with pytest.raises(ValueError, match="top_k"):
            async for _ in engine.generate(PROMPTS[0], bad, "bad"):
                pass
        with pytest.raises(TypeError, match="stop_token_ids must be a list, got int"):
            async for _ in engine.generate(PROMPTS[0], unlisted, "unlisted"):
                pass
        return [out async for out in engine.generate(PROMPTS[1], SamplingParams(max_tokens=4), "ok")], engine.errored

    try:
        outs, errored = asyncio.run(main())
    finally:
        engine.shutdown()
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 4 and not errored


def test_arrival_is_stamped_when_the_request_comes_not_when_the_engine_thread_takes_it():
    """The engine thread takes new requests between steps; a request that waited for it (here behind
    a half-second command) has waited as a user has, and its time to first token says so."""
    engine = AsyncLLM("tiny", **ENGINE)

    async def main():
        engine._submit(lambda: time.sleep(0.5), lambda error: None)  # the thread is busy for 0.5 s
        called = time.time()
        outs = [out async for out in engine.add_request("r", "def f(x):", SamplingParams(max_tokens=2))]
        return called, outs[-1].metrics

    try:
        called, metrics = asyncio.run(main())
    finally:
        engine.shutdown()
    assert called <= metrics.arrival_time < called + 0.1
    assert metrics.first_token_time - metrics.arrival_time >= 0.4  # the wait behind the busy thread counts
