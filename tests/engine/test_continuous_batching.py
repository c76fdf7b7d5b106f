"""Continuous batching in the real engine: whatever the scheduler does to a request (chunk its
prompt, batch it with others, preempt and recompute it, abort its neighbours), its greedy output is
the one it gets alone, and the pool is whole again afterwards."""

from __future__ import annotations

import random

import pytest

from minillm import LLM, SamplingParams

# Room for one sequence of max_model_len and little more: preemption is certain.
TIGHT = dict(dtype="float32", max_model_len=192, block_size=16, num_kv_blocks=14, max_num_batched_tokens=48)


def mixed_requests(n: int, seed: int = 0) -> tuple[list[dict], list[SamplingParams]]:
    """Prompts of 1 to 120 token ids (some sharing a beginning) and 1 to 60 new tokens, heavy-tailed."""
    rng = random.Random(seed)
    shared = [rng.randrange(4096) for _ in range(40)]
    prompts, params = [], []
    for _ in range(n):
        length = min(120, max(1, int(rng.paretovariate(1.2) * 8)))
        tokens = [rng.randrange(4096) for _ in range(length)]
        prompts.append({"prompt_token_ids": shared[:rng.randrange(41)] + tokens if rng.random() < 0.3 else tokens})
        params.append(SamplingParams(temperature=0.0, max_tokens=min(60, max(1, int(rng.paretovariate(1.2) * 6))),
                                     ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def alone() -> tuple[list, list, list[list[int]]]:
    prompts, params = mixed_requests(50)
    llm = LLM("tiny", dtype="float32", max_model_len=192)
    return prompts, params, [llm.generate(p, sp, use_tqdm=False)[0].outputs[0].token_ids
                             for p, sp in zip(prompts, params)]


@pytest.mark.slow
def test_fifty_mixed_requests_with_preemption_and_chunked_prefill_match_each_alone(alone):
    prompts, params, expected = alone
    llm = LLM("tiny", **TIGHT)
    engine = llm.llm_engine
    events = []
    engine.step_listeners.append(events.append)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    # The workload did exercise what it claims to.
    assert any(e.preempted for e in events)
    chunked = [s for e in events for s in e.seqs if 0 < s.prefill_tokens and s.kv_tokens < len(
        prompts[int(s.request_id)]["prompt_token_ids"])]
    assert chunked, "no prompt was split into chunks"
    assert any(any(s.prefill_tokens for s in e.seqs) and any(s.decode_tokens for s in e.seqs) for e in events)
    assert all(sum(s.prefill_tokens + s.decode_tokens for s in e.seqs) <= 48 for e in events)
    blocks = engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks and not engine.has_unfinished_requests()


@pytest.mark.slow
def test_aborts_mid_way_free_their_blocks_and_leave_the_others_unchanged(alone):
    prompts, params, expected = alone
    llm = LLM("tiny", **TIGHT)
    engine = llm.llm_engine
    for i, (p, sp) in enumerate(zip(prompts[:20], params[:20])):
        engine.add_request(str(i), p, sp)
    finished = {}
    aborted = {"3", "7", "11", "12", "19"}
    for step in range(10_000):
        if not engine.has_unfinished_requests():
            break
        if step == 5:
            for request_id in aborted:
                engine.abort_request(request_id)
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
    survivors = {str(i) for i in range(20)} - aborted
    assert survivors <= finished.keys()
    assert all(finished[r] == expected[int(r)] for r in survivors)
    blocks = engine.block_manager
    assert blocks.num_free_blocks == blocks.num_blocks


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_token_budget_is_refused(value):
    with pytest.raises(ValueError, match="max_num_batched_tokens must be an integer >= 1"):
        LLM("tiny", max_num_batched_tokens=value)
