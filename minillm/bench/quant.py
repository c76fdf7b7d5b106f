"""`minillm bench quant`: what each quantization scheme saves and what it costs, side by side in one
process.

- weights: none, int8, int4 at each group size: bytes of the decoder's linear layers (scales and
  zero points included) against fp16, held-out perplexity and its change, greedy agreement with
  the unquantized model, and greedy tokens/s on the engine's own matmuls (all prompts batched: with
  more than 16 of them a GPU runs the gemm path, with 16 or fewer the decode-shaped gemv);
- KV cache: the model's dtype against int8: bytes per token and greedy agreement;
- on a CUDA GPU, the matmul kernels alone against fp16 F.linear at batch 1 to 16
  (bench/quant_matmul.py).
"""

from __future__ import annotations

import torch

from minillm.eval.heldout import eval_token_ids
from minillm.eval.quantization import compare_kv_cache_dtype, compare_quantization
from minillm.models.loader import load_tokenizer, resolve_model_path

WEIGHT_COLUMNS = [("quantization", "weights"), ("group_size", "group"), ("weight_bytes", "linear weight bytes"),
                  ("bytes_vs_fp16", "bytes vs fp16"), ("perplexity", "perplexity"), ("perplexity_change", "change"),
                  ("greedy_agreement", "greedy agreement"), ("tokens_per_s", "tokens/s")]
KV_COLUMNS = [("kv_cache_dtype", "KV cache"), ("dtype", "model dtype"), ("kv_bytes_per_token", "bytes/token"),
              ("bytes_vs_fp16", "vs fp16"), ("bytes_vs_model_dtype", "vs model dtype"),
              ("greedy_agreement", "greedy agreement")]


def bench_quant(model: str, text: str | None, group_sizes: tuple[int, ...], *, window: int = 512,
                num_prompts: int = 32, num_tokens: int = 32, max_eval_tokens: int | None = None,
                device: str | None = None, dtype: str = "auto") -> tuple[list[dict], list[dict], list[dict], dict]:
    """Weight rows, KV-cache rows, matmul-kernel rows (empty without CUDA), and a summary."""
    token_ids = eval_token_ids(load_tokenizer(resolve_model_path(model)), text)[:max_eval_tokens]
    engine_args = {"device": device, "dtype": dtype}
    methods = [("int8", 128)] + [("int4", g) for g in group_sizes]
    weights = compare_quantization(model, token_ids, methods, window=window, num_prompts=num_prompts,
                                   num_tokens=num_tokens, **engine_args)
    kv = compare_kv_cache_dtype(model, token_ids, ("int8",), num_prompts=num_prompts, num_tokens=num_tokens,
                                **engine_args)
    matmuls = []
    if torch.cuda.is_available() and (device or "cuda").startswith("cuda"):
        from minillm.bench.quant_matmul import bench_quant_matmul

        matmuls = bench_quant_matmul()
    summary = {f"{r['quantization']}{'_g' + str(r['group_size']) if r['group_size'] else ''}_perplexity_change":
               r["perplexity_change"] for r in weights[1:]}
    summary["int8_kv_greedy_agreement"] = kv[-1]["greedy_agreement"]
    summary["int8_kv_bytes_vs_fp16"] = kv[-1]["bytes_vs_fp16"]
    return weights, kv, matmuls, summary
