"""What weight quantization costs in quality, measured against the same model unquantized:
held-out perplexity and its relative change, greedy agreement (the share of greedily generated
tokens that match the unquantized model's, position by position, from the same prompts), and the
bytes of the decoder's linear weights (scales and zero points included)."""

from __future__ import annotations

from minillm.eval.acceptance import sample_prompts
from minillm.eval.perplexity import perplexity
from minillm.llm import LLM
from minillm.quant.linear import linear_weight_bytes
from minillm.sampling_params import SamplingParams


def greedy_tokens(llm: LLM, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def compare_quantization(model: str, token_ids: list[int], methods: list[tuple[str | None, int]], *,
                         window: int = 512, num_prompts: int = 32, prompt_len: int = 32, num_tokens: int = 32,
                         seed: int = 0, **engine_args) -> list[dict]:
    """One row per (quantization, group_size), the unquantized model first."""
    prompts = sample_prompts(token_ids, num_prompts, prompt_len, seed)
    rows, baseline = [], None
    for method, group_size in [(None, 128), *methods]:
        llm = LLM(model, quantization=method, quant_group_size=group_size, **engine_args)
        result = perplexity(llm, token_ids, window=window)
        tokens = greedy_tokens(llm, prompts, num_tokens)
        held, fp16 = linear_weight_bytes(llm.llm_engine.model)
        row = {"quantization": method or "none", "group_size": group_size if method == "int4" else None,
               "perplexity": result["perplexity"], "weight_bytes": held, "bytes_vs_fp16": held / fp16,
               "tokens": result["tokens"]}
        if baseline is None:
            baseline = {**row, "greedy": tokens}
        same = sum(a == b for ours, ref in zip(tokens, baseline["greedy"]) for a, b in zip(ours, ref))
        row.update(perplexity_change=row["perplexity"] / baseline["perplexity"] - 1,
                   greedy_agreement=same / (num_prompts * num_tokens))
        rows.append(row)
    return rows
