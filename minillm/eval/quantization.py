"""What weight quantization costs in quality, measured against the same model unquantized:
held-out perplexity and its relative change, greedy agreement (the share of greedily generated
tokens that match the unquantized model's, position by position, from the same prompts), and the
bytes of the decoder's linear weights (scales and zero points included).

The same for a quantized KV cache (`compare_kv_cache_dtype`): greedy agreement with the cache in the
model's dtype, and the KV bytes per token. Perplexity is not reported there: it is computed without
a cache (model_runner.sequence_logits), so the cache's dtype cannot change it."""

from __future__ import annotations

import time

from minillm.eval.acceptance import sample_prompts
from minillm.eval.perplexity import perplexity
from minillm.kv.pool import kv_bytes_per_token
from minillm.layers.quant_linear import linear_weight_bytes
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams


def greedy_tokens(llm: LLM, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def greedy_agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """The share of tokens equal to the reference's at the same position of the same prompt."""
    same = sum(a == b for ours, ref in zip(tokens, reference) for a, b in zip(ours, ref))
    return same / sum(len(ref) for ref in reference)


def compare_quantization(model: str, token_ids: list[int], methods: list[tuple[str | None, int]], *,
                         window: int = 512, num_prompts: int = 32, prompt_len: int = 32, num_tokens: int = 32,
                         seed: int = 0, **engine_args) -> list[dict]:
    """One row per (quantization, group_size), the unquantized model first. tokens_per_s: the greedy
    generation, all prompts batched, on the engine's own matmuls (on a CPU the PyTorch reference,
    which dequantizes every weight on every call: slower than no quantization at all)."""
    prompts = sample_prompts(token_ids, num_prompts, prompt_len, seed)
    rows, baseline = [], None
    for method, group_size in [(None, 128), *methods]:
        llm = LLM(model, quantization=method, quant_group_size=group_size,
                  **_sized(engine_args, window, num_prompts, prompt_len + num_tokens))
        result = perplexity(llm, token_ids, window=window)
        greedy_tokens(llm, prompts[:1], 2)  # not timed: the first call compiles the GPU kernels
        start = time.perf_counter()
        tokens = greedy_tokens(llm, prompts, num_tokens)
        seconds = time.perf_counter() - start
        held, fp16 = linear_weight_bytes(llm.llm_engine.model)
        row = {"quantization": method or "none", "group_size": group_size if method == "int4" else None,
               "perplexity": result["perplexity"], "weight_bytes": held, "bytes_vs_fp16": held / fp16,
               "tokens": result["tokens"], "tokens_per_s": num_prompts * num_tokens / seconds}
        baseline = baseline or (row["perplexity"], tokens)  # the unquantized model's
        row.update(perplexity_change=row["perplexity"] / baseline[0] - 1,
                   greedy_agreement=greedy_agreement(tokens, baseline[1]))
        rows.append(row)
    return rows


def compare_kv_cache_dtype(model: str, token_ids: list[int], kv_cache_dtypes: tuple[str, ...] = ("int8",), *,
                           num_prompts: int = 32, prompt_len: int = 32, num_tokens: int = 32, seed: int = 0,
                           **engine_args) -> list[dict]:
    """One row per kv_cache_dtype, "auto" (the cache in the model's dtype) first, on the prompts
    compare_quantization uses: KV bytes per token (scales included), as a share of a cache in fp16 and
    of one in the model's dtype, and greedy agreement with "auto"."""
    prompts = sample_prompts(token_ids, num_prompts, prompt_len, seed)
    rows, baseline = [], None
    for kv_cache_dtype in ("auto", *kv_cache_dtypes):
        llm = LLM(model, kv_cache_dtype=kv_cache_dtype, **_sized(engine_args, 0, num_prompts, prompt_len + num_tokens))
        engine = llm.llm_engine
        tokens = greedy_tokens(llm, prompts, num_tokens)
        baseline = baseline or tokens
        held = kv_bytes_per_token(engine.model_config, engine.dtype, kv_cache_dtype)
        rows.append({"kv_cache_dtype": kv_cache_dtype, "dtype": str(engine.dtype).removeprefix("torch."),
                     "kv_bytes_per_token": held,
                     "bytes_vs_fp16": held / engine.model_config.kv_bytes_per_token(2),
                     "bytes_vs_model_dtype": held / kv_bytes_per_token(engine.model_config, engine.dtype),
                     "greedy_agreement": greedy_agreement(tokens, baseline), "tokens": sum(map(len, tokens))})
    return rows


def _sized(engine_args: dict, window: int, num_prompts: int, tokens_per_prompt: int) -> dict:
    """Engine arguments with a KV pool sized for the work: each engine of a comparison would
    otherwise take 90% of the GPU memory still free, and the next ones would find none (a freed pool
    stays in PyTorch's cache, which the free-memory count does not see)."""
    max_model_len = engine_args.get("max_model_len") or max(window, tokens_per_prompt)
    block_size = engine_args.get("block_size", 16)
    blocks = -(-max_model_len // block_size) + num_prompts * -(-tokens_per_prompt // block_size)
    return {"max_model_len": max_model_len, "num_kv_blocks": blocks, "max_num_seqs": num_prompts, **engine_args}
