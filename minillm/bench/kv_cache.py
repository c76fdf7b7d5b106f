"""`minillm bench kv-cache`: decode speed with the KV cache against recomputing every step.

Without a cache, producing token n+1 runs the whole n-token sequence through the model again, so
each step costs O(n) token computations and a generation O(n^2); with the cache each step
computes one token and reads n cached ones. Both engines run side by side on the same prompts
(real held-out text), greedy, and must produce the same tokens.
"""

from __future__ import annotations

from minillm.eval.heldout import eval_token_ids
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams

COLUMNS = [("context", "context"), ("cached_tok_s", "cached tok/s"), ("recompute_tok_s", "recompute tok/s"),
           ("speedup", "speedup"), ("cached_GB_s", "cached GB/s moved"), ("same_tokens", "same tokens")]


def seconds_per_output_token(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[float, list[int]]:
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    m = out.metrics
    # Decode steps only: the first token's time is the prefill's, which both engines share.
    return (m.last_token_time - m.first_token_time) / (len(out.outputs[0].token_ids) - 1), out.outputs[0].token_ids


def bench_kv_cache(model: str = "tiny", lengths: tuple[int, ...] = (64, 128, 256, 512, 1024),
                   decode_tokens: int = 32, **engine_args) -> tuple[list[dict], dict]:
    cached = LLM(model, kv_cache="contiguous", **engine_args)
    recompute = LLM(model, kv_cache="none", **engine_args)
    engine = cached.llm_engine
    text = eval_token_ids(cached.get_tokenizer())
    params = SamplingParams(temperature=0.0, max_tokens=decode_tokens, ignore_eos=True)
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    kv_bytes = engine.model_config.kv_bytes_per_token(engine.dtype.itemsize)
    for llm in (cached, recompute):  # warm-up: first calls pay for allocator and thread start-up
        seconds_per_output_token(llm, text[:16], SamplingParams(max_tokens=4, ignore_eos=True))
    rows = []
    for length in lengths:
        if length + decode_tokens > engine.max_model_len:
            continue
        prompt = text[:length]
        t_cached, tokens_cached = seconds_per_output_token(cached, prompt, params)
        t_recompute, tokens_recompute = seconds_per_output_token(recompute, prompt, params)
        # A decode step reads every weight once and the K/V of the whole context.
        bytes_per_step = weight_bytes + (length + decode_tokens // 2) * kv_bytes
        rows.append({"context": length, "cached_tok_s": 1 / t_cached, "recompute_tok_s": 1 / t_recompute,
                     "speedup": t_recompute / t_cached, "cached_GB_s": bytes_per_step / t_cached / 1e9,
                     "same_tokens": tokens_cached == tokens_recompute})
    summary = {"speedup_at_512": next((r["speedup"] for r in rows if r["context"] == 512), None),
               "all_outputs_identical": all(r["same_tokens"] for r in rows)}
    return rows, summary
