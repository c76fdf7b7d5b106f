"""AsyncLLM under any crowd of callers: hypothesis draws the engine (async scheduling, prefix caching,
speculation by n-gram or draft model, a pool small enough to preempt) and the callers (prompts,
lengths, one or two completions, arrival delays; some leave after a few tokens, some are cancelled
before their first). Every completion of a caller that stays must get the greedy tokens its prompt
gets alone, every one of a caller that leaves a prefix of them; afterwards the engine holds no
request, no stream and no block, and still serves. The engine thread and the callers' event loop
interleave differently from run to run: whatever the order, these must hold."""

from __future__ import annotations

import asyncio
import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm import LLM, SamplingParams
from minillm.async_llm import AsyncLLM

MAX_MODEL_LEN = 64


@functools.cache
def alone(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    llm = LLM("tiny", skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN, max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate({"prompt_token_ids": list(prompt)}, params, use_tqdm=False)[0].outputs[0].token_ids


@st.composite
def engines(draw) -> dict:
    block_size = draw(st.sampled_from([4, 16]))
    args = dict(skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=block_size,
                max_num_seqs=draw(st.integers(1, 4)), async_scheduling=draw(st.booleans()),
                # From one request at full length up: small pools preempt.
                num_kv_blocks=-(-MAX_MODEL_LEN // block_size) + draw(st.integers(0, 10)),
                enable_prefix_caching=draw(st.booleans()))
    speculative = draw(st.sampled_from([None, "ngram", "draft"]))
    if speculative == "ngram":
        args["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    elif speculative == "draft":
        args["speculative_config"] = {"model": "tiny-draft", "num_speculative_tokens": 2}
    return args


callers = st.lists(st.fixed_dictionaries({
    "prompt": st.lists(st.integers(0, 20), min_size=1, max_size=20).map(tuple),  # few ids: shared prefixes
    "max_tokens": st.integers(1, 12),
    "n": st.sampled_from([1, 1, 2]),  # completions, streamed one at a time (engine/parallel_sampling.py)
    "leave_after": st.none() | st.integers(0, 6),  # tokens seen before it leaves; 0: cancelled at once
    "delay": st.sampled_from([0, 0, 0.001, 0.01]),  # seconds before it calls
}), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(args=engines(), callers=callers)
def test_any_crowd_of_callers_gets_its_tokens_and_leaves_nothing_behind(args, callers):
    engine = AsyncLLM("tiny", **args)

    async def call(i: int, caller: dict) -> tuple[str, dict[int, list[int]]]:
        await asyncio.sleep(caller["delay"])
        params = SamplingParams(n=caller["n"], temperature=0, max_tokens=caller["max_tokens"], ignore_eos=True)
        tokens: dict[int, list[int]] = {}  # completion index -> its tokens so far
        async for out in engine.generate({"prompt_token_ids": list(caller["prompt"])}, params, f"r{i}"):
            for completion in out.outputs:
                tokens[completion.index] = completion.token_ids
                if caller["leave_after"] is not None and len(completion.token_ids) >= caller["leave_after"]:
                    return "left", tokens  # leaving the stream aborts the request, every completion of it
        return "stayed", tokens

    async def main() -> tuple[list, list[int]]:
        tasks = [asyncio.create_task(call(i, caller)) for i, caller in enumerate(callers)]
        for task, caller in zip(tasks, callers):
            if caller["leave_after"] == 0:
                await asyncio.sleep(0)
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(200):  # aborts run between two steps, on the engine's thread
            if not engine.llm_engine.has_unfinished_requests() and not engine._streams:
                break
            await asyncio.sleep(0.01)
        after = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
        final = [out async for out in engine.generate({"prompt_token_ids": [1, 2, 3]}, after, "after")]
        return results, final[-1].outputs[0].token_ids

    try:
        results, after = asyncio.run(main())
    finally:
        engine.shutdown()
    for caller, result in zip(callers, results):
        if isinstance(result, BaseException):
            assert isinstance(result, asyncio.CancelledError) and caller["leave_after"] == 0, repr(result)
            continue
        how, completions = result
        want = alone(caller["prompt"], caller["max_tokens"])
        if how == "stayed":
            assert sorted(completions) == list(range(caller["n"])), caller
        for tokens in completions.values():
            assert tokens == (want if how == "stayed" else want[:len(tokens)]), caller
    assert after == alone((1, 2, 3), 3)
    blocks = engine.llm_engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks, "KV blocks leaked"
    assert not engine.llm_engine.has_unfinished_requests() and not engine._streams
    assert not engine.llm_engine.parallel_sampling.parents, "a request of n completions was kept"
