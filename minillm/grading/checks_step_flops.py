"""Checks for exercise 08, part 2: the learner's `step_flops`, the arithmetic of a step of decode,
prefill or a chunk after cached tokens, on real and random Llama-family configurations. Expected values
come from `step_flops` of minillm.bench.decode (the roofline's accounting, which tests check against
the loaded modules).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from minillm.bench import decode
from minillm.config.model import ModelConfig
from minillm.grading.feedback import call_learner
from minillm.grading.roofline_cases import cases, equal, expect_number, fail, named_mistake


def _flops_mistakes(c: ModelConfig, n: int, context: int) -> dict[str, float]:
    params = c.parameter_counts()
    matmul_weights = params["linear"] + (params["head"] or params["embedding"])
    per_key = 4 * c.num_attention_heads * c.head_dim * c.num_hidden_layers
    keys = n * context + n * (n + 1) // 2
    matmul, attention = 2 * matmul_weights * n, per_key * keys
    embedding = 2 * c.vocab_size * c.hidden_size * n
    mlp_matrix = c.hidden_size * c.intermediate_size
    return {
        "you count attention with num_key_value_heads: K and V are shared, but every query head computes its "
        "own scores and weighted sum, so attention's flops scale with num_attention_heads":
            matmul + attention * c.num_key_value_heads // c.num_attention_heads,
        "you count one flop per weight: a multiply and an add make two": matmul / 2 + attention,
        "you leave attention out: each new token also scores its query against the keys up to its own position":
            matmul,
        "you count attention in one layer: every layer computes its own scores and weighted sums":
            matmul + attention // c.num_hidden_layers,
        "you count two MLP matrices: Llama's MLP has three, gate_proj and up_proj (hidden_size to "
        "intermediate_size) and down_proj (back)": matmul - 2 * c.num_hidden_layers * mlp_matrix * n + attention,
        "you count only the scores (Q.K): summing the values (P.V) costs as much again": matmul + attention / 2,
        "you let each new token attend to every new token: attention is causal, token p sees keys 0..p only":
            matmul + per_key * (n * context + n * n),
        "you leave out the token's own key: the token at position p attends to p + 1 keys, itself included":
            matmul + per_key * (n * context + n * (n - 1) // 2),
        "you count the tied embedding twice: the output head is that same matrix, one matmul":
            matmul + (embedding if c.tie_word_embeddings else 0) + attention,
        "you count the embedding lookup as a matmul: it copies one row per token, no arithmetic":
            matmul + (0 if c.tie_word_embeddings else embedding) + attention,
        "you leave out the output head: the logits are a vocab_size x hidden_size matmul per token":
            matmul - embedding + attention,
        "you use hidden_size // num_attention_heads as the head dimension: read config.head_dim":
            decode.step_flops(dataclasses.replace(c, head_dim=c.hidden_size // c.num_attention_heads), n, context),
    }


def check_step_flops(step_flops: Callable) -> None:
    """One token after a context (decode), a whole prompt (prefill), and a chunk after cached tokens."""
    runs = 0
    for case in cases(seed=1):
        for num_tokens, context in ((1, 0), (1, 300), (64, 0), (7, 11), (128, 512)):
            where = f"{case}; num_tokens={num_tokens}, context={context}"
            got = call_learner(step_flops, "step_flops", where, case.config, num_tokens, context)
            expect_number(got, "step_flops", where)
            expected = decode.step_flops(case.config, num_tokens, context)
            runs += 1
            if equal(got, expected):
                continue
            params = case.config.parameter_counts()
            weights = params["linear"] + (params["head"] or params["embedding"])
            keys = num_tokens * context + num_tokens * (num_tokens + 1) // 2
            fail("step_flops", got, expected, where,
                 named_mistake(got, expected, _flops_mistakes(case.config, num_tokens, context)),
                 f"2 x {weights:,} matmul weights x {num_tokens} tokens + 4 x {case.config.num_attention_heads} "
                 f"heads x {case.config.head_dim} x {case.config.num_hidden_layers} layers x {keys:,} keys "
                 f"(num_tokens x context + num_tokens x (num_tokens + 1) / 2)")
    print(f"check_step_flops passed: {runs} inputs (decode, prefill and chunks, tied and untied, GQA)")
