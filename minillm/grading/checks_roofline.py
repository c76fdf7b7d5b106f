"""Checks for exercise 08, the engine's accounting: the learner's `decode_step_bytes`, `step_flops`
and `plan_kv_blocks`, on real and random Llama-family configurations, and the planner sizing a real
engine's KV pool.

Expected values come from the engine's own functions: `decode_step_bytes` and `step_flops` of
minillm.bench.decode (the roofline's accounting, which tests check against the loaded modules),
and `plan_kv_blocks` of minillm.kv.pool (what the engine sizes its pool with). A wrong answer is
compared with what the common mistakes give (attention heads where KV heads belong, K without V, a
tied embedding counted twice, int8 scales forgotten, bits for bytes, ...), so that the message can
name the mistake.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from unittest import mock

import torch

from minillm.bench import decode
from minillm.config.model import ModelConfig
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.kv import pool as kv_pool
from minillm.kv.pool import kv_bytes_per_token
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass(frozen=True)
class Case:
    label: str
    config: ModelConfig

    def __str__(self) -> str:
        c = self.config
        return (f"{self.label}: {c.num_hidden_layers} layers, hidden_size {c.hidden_size}, "
                f"{c.num_attention_heads} attention heads and {c.num_key_value_heads} KV heads of head_dim "
                f"{c.head_dim}, intermediate_size {c.intermediate_size}, vocab {c.vocab_size}, "
                f"{'tied' if c.tie_word_embeddings else 'untied'} embeddings")


def llama(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int, tied: bool,
          head_dim: int | None = None) -> ModelConfig:
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "intermediate_size": intermediate, "tie_word_embeddings": tied}
    if head_dim is not None:
        raw["head_dim"] = head_dim
    return ModelConfig.from_hf_dict(raw)


def cases(seed: int = 0, num_random: int = 6) -> list[Case]:
    """Published configurations, then random ones: every random one has grouped-query attention (or
    one KV head for all), and they alternate tied and untied embeddings; one in three has a head_dim
    that is not hidden_size / num_attention_heads (as Qwen3's and Gemma's)."""
    found = [Case("Llama-3-8B", llama(4096, 32, 32, 8, 14336, 128256, False)),
             Case("SmolLM2-360M", llama(960, 32, 15, 5, 2560, 49152, True)),
             Case("Llama-2-7B (one KV head per attention head)", llama(4096, 32, 32, 32, 11008, 32000, False))]
    rng = random.Random(seed)
    for i in range(num_random):
        heads = rng.choice((4, 6, 8, 12, 16))
        kv_heads = rng.choice([d for d in range(1, heads) if heads % d == 0])
        head_dim = rng.choice((16, 32, 64))
        hidden = heads * head_dim if i % 3 else rng.choice((64, 96, 128))
        found.append(Case(f"random configuration {i + 1}", llama(
            hidden, rng.randint(1, 6), heads, kv_heads, rng.choice((2, 3, 4)) * hidden, rng.choice((256, 512, 1000)),
            tied=i % 2 == 0, head_dim=head_dim if hidden != heads * head_dim else None)))
    return found


def _equal(got: object, expected: int) -> bool:
    try:
        return abs(float(got) - expected) <= 1e-12 * max(1, abs(expected))
    except (TypeError, ValueError):
        return False


def _number(got: object, name: str, where: str) -> None:
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise CheckFailed(f"{name} returned {type(got).__name__}; expected a number (a Python int)"
                          + (" : call .item() on a one-element tensor" if isinstance(got, torch.Tensor) else "")
                          + f"\n  on input: {where}")


def _named(got: object, expected: int, mistakes: dict[str, float]) -> str | None:
    """The first mistake that gives the learner's answer, unless it also gives the right one."""
    return next((hint for hint, value in mistakes.items() if value != expected and _equal(got, int(value))), None)


def _fail(name: str, got: object, expected: int, where: str, mistake: str | None, breakdown: str) -> None:
    text = f"{name} returned {got:,}; expected {expected:,}\n  on input: {where}\n  expected = {breakdown}"
    if mistake:
        text += f"\n  your answer is what you get if {mistake}"
    raise CheckFailed(text)


# ---- decode_step_bytes ----

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
            _number(got, "decode_step_bytes", where)
            expected = decode.decode_step_bytes(case.config, batch, context, dtype, kv_dtype)
            runs += 1
            if _equal(got, expected):
                continue
            weights = _weights(case.config) * dtype.itemsize
            kv = kv_bytes_per_token(case.config, dtype, kv_dtype)
            _fail("decode_step_bytes", got, expected, where,
                  _named(got, expected, _bytes_mistakes(case.config, batch, context, dtype, kv_dtype)),
                  f"weights read {weights:,} + {batch} sequences x {context} tokens x {kv:,} bytes of K and V per "
                  f"token")
    print(f"check_decode_step_bytes passed: {runs} inputs ({len(cases())} configurations, GQA and MQA, tied and "
          "untied embeddings, fp16/bf16/fp32, int8 KV)")


# ---- step_flops ----

def _flops_mistakes(c: ModelConfig, n: int, context: int) -> dict[str, float]:
    params = c.parameter_counts()
    matmul_weights = params["linear"] + (params["head"] or params["embedding"])
    per_key = 4 * c.num_attention_heads * c.head_dim * c.num_hidden_layers
    keys = n * context + n * (n + 1) // 2
    matmul, attention = 2 * matmul_weights * n, per_key * keys
    embedding = 2 * c.vocab_size * c.hidden_size * n
    return {
        "you count attention with num_key_value_heads: K and V are shared, but every query head computes its "
        "own scores and weighted sum, so attention's flops scale with num_attention_heads":
            matmul + attention * c.num_key_value_heads // c.num_attention_heads,
        "you count one flop per weight: a multiply and an add make two": matmul / 2 + attention,
        "you leave attention out: each new token also scores its query against the keys up to its own position":
            matmul,
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
            _number(got, "step_flops", where)
            expected = decode.step_flops(case.config, num_tokens, context)
            runs += 1
            if _equal(got, expected):
                continue
            params = case.config.parameter_counts()
            weights = params["linear"] + (params["head"] or params["embedding"])
            keys = num_tokens * context + num_tokens * (num_tokens + 1) // 2
            _fail("step_flops", got, expected, where, _named(got, expected, _flops_mistakes(case.config, num_tokens,
                                                                                               context)),
                  f"2 x {weights:,} matmul weights x {num_tokens} tokens + 4 x {case.config.num_attention_heads} "
                  f"heads x {case.config.head_dim} x {case.config.num_hidden_layers} layers x {keys:,} keys "
                  f"(num_tokens x context + num_tokens x (num_tokens + 1) / 2)")
    print(f"check_step_flops passed: {runs} inputs (decode, prefill and chunks, tied and untied, GQA)")


# ---- plan_kv_blocks ----

def _plan_mistakes(c: ModelConfig, free: int, block_size: int, dtype: torch.dtype, kv_dtype: str) -> dict[str, float]:
    per_token = kv_bytes_per_token(c, dtype, kv_dtype)
    block = block_size * per_token
    heads_as_kv = dataclasses.replace(c, num_key_value_heads=c.num_attention_heads)
    element = 1 if kv_dtype == "int8" else dtype.itemsize
    return {
        "you count the K and V of num_attention_heads heads: the cache holds num_key_value_heads":
            free // (block_size * kv_bytes_per_token(heads_as_kv, dtype, kv_dtype)),
        "you count only K (or only V) in a block": free // (block // 2),
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
            _number(got, "plan_kv_blocks", where)
            expected = kv_pool.plan_kv_blocks(case.config, free, block_size, dtype, kv_dtype)
            runs += 1
            if _equal(got, expected) and isinstance(got, int):
                continue
            if _equal(got, expected) or (isinstance(got, float) and int(got) == expected):
                raise CheckFailed(f"plan_kv_blocks returned {got!r}, a {type(got).__name__}; return an int "
                                  f"(floor division //): the engine allocates whole blocks\n  on input: {where}")
            per_token = kv_bytes_per_token(case.config, dtype, kv_dtype)
            _fail("plan_kv_blocks", got, expected, where,
                  _named(got, expected, _plan_mistakes(case.config, free, block_size, dtype, kv_dtype)),
                  f"{free:,} // ({block_size} tokens x {per_token:,} bytes of K and V per token)")
    print(f"check_plan_kv_blocks passed: {runs} inputs (fp16/bf16/fp32 and int8 caches, blocks of 8 to 32 tokens)")


# ---- the planner in the engine ----

def check_engine(plan_kv_blocks: Callable, model: str, device: str | None = None) -> None:
    """The engine sizes its KV pool with the learner's planner, from a budget of memory given here (as if
    gpu_memory_utilization of the free memory left that much): the pool must have exactly the blocks
    the engine's own planner gives, for both KV dtypes, and the engine sized by the learner's planner
    must generate the tokens that an engine with a pool of the engine's own size generates."""
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
