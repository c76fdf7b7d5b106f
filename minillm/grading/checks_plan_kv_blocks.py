"""Checks for exercise 08, part 3: the learner's `plan_kv_blocks`, how many KV blocks fit in the free
memory, on real and random Llama-family configurations, block sizes, dtypes and KV dtypes. Expected
values come from `plan_kv_blocks` of minillm.kv.pool, what the engine sizes its pool with.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import torch

from minillm.config.model import ModelConfig
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.grading.roofline_cases import DTYPES, cases, equal, expect_number, fail, named_mistake
from minillm.kv import pool as kv_pool
from minillm.kv.pool import kv_bytes_per_token


def _plan_mistakes(c: ModelConfig, free: int, block_size: int, dtype: torch.dtype, kv_dtype: str) -> dict[str, float]:
    per_token = kv_bytes_per_token(c, dtype, kv_dtype)
    block = block_size * per_token
    heads_as_kv = dataclasses.replace(c, num_key_value_heads=c.num_attention_heads)
    element = 1 if kv_dtype == "int8" else dtype.itemsize
    return {
        "you count the K and V of num_attention_heads heads: the cache holds num_key_value_heads":
            free // (block_size * kv_bytes_per_token(heads_as_kv, dtype, kv_dtype)),
        "you count only K (or only V) in a block": free // (block // 2),
        "you count the K and V of one layer: every layer caches its own, so a token takes num_hidden_layers "
        "times as much": free // (block // c.num_hidden_layers),
        "you leave out the int8 cache's scales: one float32 per token, layer, K or V, and KV head":
            free // (block_size * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * element),
        "you size int8 blocks in the model's dtype: kv_cache_dtype='int8' stores 1 byte per element":
            free // (block_size * kv_bytes_per_token(c, dtype)),
        "you round up: a block that does not fit whole cannot be allocated": -(-free // block),
        "you return tokens, not blocks: divide by bytes per block, block_size tokens each": free // per_token,
        "you count bits, not bytes": free // (block * 8),
    }


def check_plan_kv_blocks(plan_kv_blocks: Callable) -> None:
    """Random free memory, block sizes, dtypes and both KV dtypes; the answer is a whole number of blocks."""
    rng = random.Random(8)
    runs = 0
    for i, case in enumerate(cases(seed=2)):
        for kv_dtype in ("auto", "int8"):
            block_size = rng.choice((8, 16, 32))
            dtype = DTYPES[(i + runs) % len(DTYPES)]
            free = rng.randrange(10**6, 10**10)
            where = (f"{case}; free_bytes={free:,}, block_size={block_size}, dtype={dtype}, "
                     f"kv_cache_dtype={kv_dtype!r}")
            got = call_learner(plan_kv_blocks, "plan_kv_blocks", where, case.config, free, block_size, dtype, kv_dtype)
            expect_number(got, "plan_kv_blocks", where)
            expected = kv_pool.plan_kv_blocks(case.config, free, block_size, dtype, kv_dtype)
            runs += 1
            if equal(got, expected) and isinstance(got, int):
                continue
            if equal(got, expected) or (isinstance(got, float) and int(got) == expected):
                raise CheckFailed(f"plan_kv_blocks returned {got!r}, a {type(got).__name__}; return an int "
                                  f"(floor division //): the engine allocates whole blocks\n  on input: {where}")
            per_token = kv_bytes_per_token(case.config, dtype, kv_dtype)
            fail("plan_kv_blocks", got, expected, where,
                 named_mistake(got, expected, _plan_mistakes(case.config, free, block_size, dtype, kv_dtype)),
                 f"{free:,} // ({block_size} tokens x {per_token:,} bytes of K and V per token)")
    print(f"check_plan_kv_blocks passed: {runs} inputs (fp16/bf16/fp32 and int8 caches, blocks of 8 to 32 tokens)")
