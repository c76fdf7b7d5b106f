"""Checks for exercise 08, part 4: the learner's `plan_kv_blocks` sizing a real engine's KV pool, for
both KV dtypes, and that engine generating what one with a pool of its own size generates.
"""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

from minillm.grading.feedback import CheckFailed, call_learner
from minillm.kv import pool as kv_pool
from minillm.kv.pool import kv_bytes_per_token
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams


def check_engine(plan_kv_blocks: Callable, model: str, device: str | None = None) -> None:
    """The engine sizes its KV pool with the learner's planner, from a budget of memory given here (as
    if gpu_memory_utilization of the memory, less the weights, left that much): the pool must have
    exactly the blocks the engine's own planner gives, for both KV dtypes, and the engine sized by the
    learner's planner must generate the tokens that an engine with a pool of the engine's own size
    generates."""
    engine_args = dict(device=device, max_model_len=256, max_num_seqs=16, enable_prefix_caching=False,
                       skip_tokenizer_init=True)

    def learner(config, free_bytes, block_size, dtype, kv_cache_dtype="auto", extra_bytes_per_token=0):
        if extra_bytes_per_token:  # never here: no draft model shares this pool
            raise CheckFailed("this check sizes a pool without a draft model")
        return call_learner(plan_kv_blocks, "plan_kv_blocks", f"the engine's pool, {kv_cache_dtype=}", config,
                            free_bytes, block_size, dtype, kv_cache_dtype)

    engines, budget = {}, None
    for kv_dtype in ("auto", "int8"):
        if budget is None:  # 40 and a half blocks of the model's dtype; an int8 cache fits more in it
            probe = LLM(model, num_kv_blocks=16, **engine_args).llm_engine  # 16 blocks: one max_model_len sequence
            per_block = 16 * kv_bytes_per_token(probe.model_config, probe.dtype)
            budget = 40 * per_block + per_block // 2
            config, dtype = probe.model_config, probe.dtype
        expected = kv_pool.plan_kv_blocks(config, budget, 16, dtype, kv_dtype)
        with mock.patch.object(kv_pool, "available_kv_bytes", lambda device, utilization, budget=budget: budget), \
                mock.patch.object(kv_pool, "plan_kv_blocks", learner):
            try:
                sized = LLM(model, kv_cache_dtype=kv_dtype, **engine_args)
            except ValueError as error:
                raise CheckFailed(f"the engine refused the pool your plan_kv_blocks sized from a budget of "
                                  f"{budget:,} bytes (kv_cache_dtype={kv_dtype!r}): {error}") from None
        blocks = sized.llm_engine.trace_info().num_kv_blocks
        if blocks != expected:
            raise CheckFailed(f"with your plan_kv_blocks the engine's pool has {blocks} blocks for a budget of "
                              f"{budget:,} bytes (kv_cache_dtype={kv_dtype!r}); its own planner gives {expected}: "
                              "run check_plan_kv_blocks for the reason")
        engines[kv_dtype] = sized
    # Three requests that need 24 of the 40 blocks at once: the pool the learner sized holds them.
    prompts = [{"prompt_token_ids": list(range(10 + 7 * i, 10 + 7 * i + 100))} for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    reference = LLM(model, num_kv_blocks=kv_pool.plan_kv_blocks(config, budget, 16, dtype), **engine_args)
    mine = [o.outputs[0].token_ids for o in engines["auto"].generate(prompts, params, use_tqdm=False)]
    theirs = [o.outputs[0].token_ids for o in reference.generate(prompts, params, use_tqdm=False)]
    if mine != theirs:
        raise CheckFailed("the engine whose pool your plan_kv_blocks sized generated other tokens than the same "
                          "engine with a pool of its own size")
    print(f"check_engine passed: the engine sized its pool with your plan_kv_blocks ("
          f"{engines['auto'].llm_engine.trace_info().num_kv_blocks} blocks, "
          f"{engines['int8'].llm_engine.trace_info().num_kv_blocks} with an int8 cache, from the same "
          f"{budget / 2**20:.1f} MiB) and generated the same tokens as with a pool of its own size")
