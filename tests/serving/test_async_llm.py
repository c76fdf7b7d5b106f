"""AsyncLLM: many asyncio callers on one engine thread; a caller that leaves aborts its request."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from minillm import LLM, SamplingParams
from minillm.async_llm import AsyncLLM, EngineDeadError
from minillm.entrypoints.serving_engine import fan_out, prepare

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
        return texts, left, await engine.get_metrics(), list(engine._streams)

    try:
        texts, left, metrics, streams = asyncio.run(main())
    finally:
        engine.shutdown()
    assert texts == expected and all(n >= 3 for n in left)
    blocks = engine.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks and not engine.llm_engine.has_unfinished_requests()
    assert streams == []  # the engine thread holds nothing more of a finished or aborted request
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


async def finished_reasons(engine: AsyncLLM) -> dict[str, float]:
    """How many requests finished for each reason, from the engine's metrics (reasons never met left out)."""
    return {m.labels["finished_reason"]: m.value for m in await engine.get_metrics()
            if m.name == "vllm:request_success" and m.value}


def test_a_request_id_in_use_fails_the_second_caller_alone():
    """The engine refuses an id already in it; the refused caller gets the ValueError, and its leaving
    must not abort the first request of that id, which still runs to its end."""
    engine = AsyncLLM("tiny", **ENGINE)
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    async def main():
        async with asyncio.timeout(60):
            first = engine.add_request("same", PROMPTS[0], params)
            head = await anext(first)
            with pytest.raises(ValueError, match="'same' is already in the engine"):
                async for _ in engine.add_request("same", PROMPTS[1], params):
                    pass
            return [head] + [out async for out in first]

    try:
        outs = asyncio.run(main())
    finally:
        engine.shutdown()
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "length"
    assert len(outs[-1].outputs[0].token_ids) == 8


def test_a_request_whose_callers_event_loop_closed_is_aborted():
    """A caller whose event loop is gone can be sent nothing more: its request is aborted at the next
    output rather than generating the rest of its tokens for nobody."""
    engine = AsyncLLM("tiny", **ENGINE)

    async def leave() -> None:
        engine.add_request("gone", PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True))  # never read

    try:
        asyncio.run(leave())
        deadline = time.time() + 60
        while not (reasons := asyncio.run(finished_reasons(engine))) and time.time() < deadline:
            time.sleep(0.05)
        generated = [m.value for m in asyncio.run(engine.get_metrics()) if m.name == "vllm:generation_tokens"]
    finally:
        engine.shutdown()
    assert reasons == {"abort": 1}
    assert generated[0] < 200
    blocks = engine.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_shutdown_aborts_what_runs_and_fails_its_callers_and_later_ones():
    """Shutdown frees the blocks of the requests still running; their callers, and any caller after
    it, get EngineDeadError rather than waiting for outputs that never come."""
    engine = AsyncLLM("tiny", **ENGINE)

    async def main() -> None:
        async with asyncio.timeout(60):
            outputs = engine.add_request("running", PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True))
            await anext(outputs)
            engine.shutdown()
            with pytest.raises(EngineDeadError, match="shut down"):
                async for _ in outputs:
                    pass
            with pytest.raises(EngineDeadError, match="shut down"):
                async for _ in engine.generate(PROMPTS[1], SamplingParams(max_tokens=2), "late"):
                    pass

    asyncio.run(main())
    assert not engine.is_running and not engine.llm_engine.has_unfinished_requests()
    blocks = engine.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


def test_a_dying_engine_fails_the_commands_waiting_and_its_metrics_stay_readable():
    """A metrics read queued while the step that kills the loop runs gets EngineDeadError; once the
    engine is dead its metrics are read directly, as /metrics still answers, and its health check raises."""
    engine = AsyncLLM("tiny", **ENGINE)
    started, release = threading.Event(), threading.Event()

    def broken():
        started.set()
        release.wait(30)
        raise RuntimeError("device lost")

    engine.llm_engine.step = broken

    async def main():
        async with asyncio.timeout(60):
            await engine.check_health()
            outputs = engine.add_request("r", PROMPTS[0], SamplingParams(max_tokens=4))
            assert await asyncio.to_thread(started.wait, 30)
            waiting = asyncio.ensure_future(engine.get_metrics())
            await asyncio.sleep(0)  # its command is queued behind the step
            release.set()
            with pytest.raises(EngineDeadError, match="device lost"):
                await waiting
            with pytest.raises(EngineDeadError, match="device lost"):
                await anext(outputs)
            with pytest.raises(EngineDeadError, match="device lost"):
                await engine.check_health()
            return await engine.get_metrics()

    try:
        metrics = asyncio.run(main())
    finally:
        engine.shutdown()
    assert any(m.name == "vllm:num_requests_running" for m in metrics)


def test_choices_cancelled_before_their_streams_start_are_aborted_by_id():
    """A response's merge cancelled at its first wait, before the tasks that read its choices have
    run: no choice's stream was ever opened to abort it on closing, so the merge aborts them by id."""
    engine = AsyncLLM("tiny", **ENGINE)
    params = SamplingParams(n=2, max_tokens=200, ignore_eos=True)

    async def main() -> dict[str, float]:
        prepared = prepare(engine, [{"prompt_token_ids": [5, 6, 7]}], params)
        merge = anext(fan_out(engine, "cmpl-x", prepared, time.time()))
        merge.send(None)  # the choices are queued and their readers created, not yet run
        with pytest.raises(asyncio.CancelledError):
            merge.throw(asyncio.CancelledError())
        async with asyncio.timeout(60):
            while sum((reasons := await finished_reasons(engine)).values()) < 2:
                await asyncio.sleep(0.05)
        return reasons

    try:
        reasons = asyncio.run(main())
    finally:
        engine.shutdown()
    assert reasons == {"abort": 2}
