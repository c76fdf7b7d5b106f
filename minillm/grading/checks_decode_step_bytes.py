"""Checks for exercise 08, part 1: the learner's `decode_step_bytes`, the bytes a decode step reads,
on real and random Llama-family configurations, batches, contexts, dtypes and KV dtypes. Expected
values come from `decode_step_bytes` of minillm.bench.decode (the roofline's accounting, which tests
check against the loaded modules).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from minillm.bench import decode
from minillm.config.model import ModelConfig
from minillm.grading.feedback import call_learner
from minillm.grading.roofline_cases import DTYPES, cases, equal, expect_number, fail, named_mistake
from minillm.kv.pool import kv_bytes_per_token


def _weights(config: ModelConfig) -> int:
    """Parameters a decode step reads, as decode_step_bytes counts them."""
    return decode.decode_step_bytes(config, 0, 0, torch.int8)  # 1 byte each, no KV


def _bytes_mistakes(c: ModelConfig, batch: int, context: int, dtype: torch.dtype, kv_dtype: str) -> dict[str, float]:
    size, bits = dtype.itemsize, torch.finfo(dtype).bits
    weights = _weights(c) * size
    kv = kv_bytes_per_token(c, dtype, kv_dtype)
    per_kv_element = 1 if kv_dtype == "int8" else size
    heads_as_kv = dataclasses.replace(c, num_key_value_heads=c.num_attention_heads)
    embedding = c.vocab_size * c.hidden_size * size
    tokens = batch * context
    return {
        "you count the K and V of num_attention_heads heads: the cache holds num_key_value_heads heads per layer "
        "(grouped-query attention shares each KV head among several query heads)":
            weights + tokens * kv_bytes_per_token(heads_as_kv, dtype, kv_dtype),
        "you count the K and V projections of num_attention_heads heads too: k_proj and v_proj map hidden_size "
        "to num_key_value_heads * head_dim":
            decode.decode_step_bytes(heads_as_kv, batch, context, dtype, kv_dtype),
        "you count only K (or only V): each cached token holds both, in every layer":
            weights + tokens * kv / 2,
        "you count the K and V of one layer: every layer caches its own":
            weights + tokens * kv / c.num_hidden_layers,
        "you count the KV cache of one sequence: each of the batch's sequences reads its own":
            weights + context * kv,
        "you count the weights once per sequence: they are read once per step, whatever the batch":
            batch * weights + tokens * kv,
        "you count the tied embedding twice: with tie_word_embeddings the output head is the embedding table, "
        "read once": weights + (embedding if c.tie_word_embeddings else 0) + tokens * kv,
        "you count the whole untied embedding table: a decode step looks up one row of it per sequence "
        "(counted as nothing); only the output head, a separate matrix, is read whole":
            weights + (0 if c.tie_word_embeddings else embedding) + tokens * kv,
        "you leave out the output head (vocab_size x hidden_size): every step computes logits with it":
            weights - embedding + tokens * kv,
        "you leave out the int8 cache's scales: one float32 scale per token, layer, K or V, and KV head":
            weights + tokens * 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * per_kv_element,
        "you store the int8 cache in the model's dtype: with kv_cache_dtype='int8' each element takes 1 byte "
        "(plus the scales)": weights + tokens * kv_bytes_per_token(c, dtype),
        "you count bits, not bytes (torch.finfo(dtype).bits is 8x dtype.itemsize)":
            weights * 8 + tokens * kv * 8,
        "you count the weights in bits, not bytes": _weights(c) * bits + tokens * kv,
        "you use hidden_size // num_attention_heads as the head dimension: read config.head_dim":
            decode.decode_step_bytes(dataclasses.replace(c, head_dim=c.hidden_size // c.num_attention_heads), batch,
                                     context, dtype, kv_dtype),
        "you count two MLP matrices: Llama's MLP has three, gate_proj and up_proj (hidden_size to "
        "intermediate_size) and down_proj (back)":
            weights - c.num_hidden_layers * c.hidden_size * c.intermediate_size * size + tokens * kv,
        "you leave out the norms' weights (two per layer and a final one)":
            weights - c.parameter_counts()["other"] * size + tokens * kv,
    }


def check_decode_step_bytes(decode_step_bytes: Callable) -> None:
    """Every configuration at batch 1 and larger, short and long contexts, three dtypes, both KV dtypes."""
    runs = 0
    for i, case in enumerate(cases()):
        for batch, context, kv_dtype in ((1, 0, "auto"), (1, 1000, "auto"), (8, 4096, "auto"), (3, 517, "int8")):
            dtype = DTYPES[(i + batch) % len(DTYPES)]
            where = f"{case}; batch={batch}, context={context}, dtype={dtype}, kv_cache_dtype={kv_dtype!r}"
            got = call_learner(decode_step_bytes, "decode_step_bytes", where, case.config, batch, context, dtype,
                               kv_dtype)
            expect_number(got, "decode_step_bytes", where)
            expected = decode.decode_step_bytes(case.config, batch, context, dtype, kv_dtype)
            runs += 1
            if equal(got, expected):
                continue
            weights = _weights(case.config) * dtype.itemsize
            kv = kv_bytes_per_token(case.config, dtype, kv_dtype)
            fail("decode_step_bytes", got, expected, where,
                 named_mistake(got, expected, _bytes_mistakes(case.config, batch, context, dtype, kv_dtype)),
                 f"weights read {weights:,} + {batch} sequences x {context} tokens x {kv:,} bytes of K and V per "
                 f"token")
    print(f"check_decode_step_bytes passed: {runs} inputs ({len(cases())} configurations, GQA and MQA, tied and "
          "untied embeddings, fp16/bf16/fp32, int8 KV)")
