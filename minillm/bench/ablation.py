"""The course's techniques switched on one at a time, on this machine: chapter 08's ablation table.

Each row changes one engine option against the same engine without it, on a small workload, and
measures what the option is for: decode tokens per second (the KV cache, paging, quantized weights,
an INT8 KV cache, speculation, the attention backend, CUDA graphs), time to first token behind a
shared prompt (prefix caching), the longest step a decoding request waits through while a long
prompt arrives (chunked prefill), or how many sequences the KV memory holds (INT8 KV). `gain` is
always "times better": above 1 the option helped here, below 1 it cost. Rows that need a CUDA GPU
are kept on other machines with the reason they were skipped.

Workloads are deliberately small (a few requests of held-out text, tens of tokens), so the table
takes seconds on a CPU; prefix caching is off except in its own row, so that repeated timing runs
of the same prompts measure the same work.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from minillm.bench.paged import bench_prefix_cache
from minillm.bench.spec import workload
from minillm.engine.trace import record
from minillm.kv.pool import plan_kv_blocks
from minillm.llm import LLM
from minillm.models.loader import resolve_model_path
from minillm.models.registry import read_model_config
from minillm.sampling_params import SamplingParams

COLUMNS = [("technique", "technique"), ("change", "change"), ("workload", "workload"), ("metric", "metric"),
           ("before", "before"), ("after", "after"), ("gain", "gain")]
GPU_ONLY = "needs a CUDA GPU"


def _row(technique: str, change: str, workload_: str, metric: str, higher_is_better: bool,
         before: float | None = None, after: float | None = None, skipped: str | None = None) -> dict:
    gain = None
    if skipped is None:
        gain = after / before if higher_is_better else before / after
    return {"technique": technique, "change": change, "workload": workload_, "metric": metric,
            "higher_is_better": higher_is_better, "before": before, "after": after, "gain": gain, "skipped": skipped}


def paired_tokens_per_s(before: LLM, after: LLM, batch: int, new_tokens: int, repeats: int = 2
                        ) -> tuple[float, float]:
    """Generated tokens per second of two engines on the same `batch` held-out prompts of 32 tokens,
    `new_tokens` each, greedy. After a warm-up each (the first run of an engine pays one-off costs),
    the two are timed in turn, `repeats` times, and each keeps its best run: a machine busy with
    other work then weighs on both alike, instead of on whichever happened to run during a spike."""
    prompts, params = workload(before.llm_engine.model_name, batch, new_tokens, 0.0)
    engines = (before, after)
    for llm in engines:
        llm.generate(prompts[:1], params[:1], use_tqdm=False)
    best, tokens = [float("inf")] * 2, [0, 0]
    for _ in range(repeats):
        for i, llm in enumerate(engines):
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            best[i] = min(best[i], time.perf_counter() - start)
            tokens[i] = sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens[0] / best[0], tokens[1] / best[1]


def longest_stall_ms(llm: LLM, long_prompt: int, decoders: int = 4) -> float:
    """`decoders` short requests are decoding when a prompt of `long_prompt` tokens arrives: the
    longest step (ms) that any of them waited through for its next token, until the long one has its
    first token. Without a token budget that step computes the whole prompt."""
    engine = llm.llm_engine
    short = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    ids = [f"short-{i}" for i in range(decoders)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, {"prompt_token_ids": list(range(20 + i, 36 + i))}, short)
    engine.step()  # their prefills
    engine.add_request("long", {"prompt_token_ids": [(7 * i) % 997 + 3 for i in range(long_prompt)]},
                       SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    longest = 0.0
    with record(llm) as trace:
        while not any(s.request_id == "long" and s.finish_reason for e in trace.events for s in e.seqs):
            start = time.perf_counter()
            engine.step()
            elapsed = time.perf_counter() - start
            if any(s.decode_tokens for s in trace.events[-1].seqs):
                longest = max(longest, elapsed)
    for request_id in ids:
        engine.abort_request(request_id)
    return longest * 1e3


def _pool_sequences(llm: LLM, budget_bytes: int, seq_tokens: int, kv_cache_dtype: str) -> int:
    """Sequences of `seq_tokens` tokens whose K and V fit in `budget_bytes`, as the engine sizes its pool."""
    engine = llm.llm_engine
    block_size = engine.config.cache.block_size
    blocks = plan_kv_blocks(engine.model_config, budget_bytes, block_size, engine.dtype, kv_cache_dtype)
    return blocks // -(-seq_tokens // block_size)


def ablation_rows(model: str, draft_model: str | None = None, device: str | None = None, *,
                  large_batch: int | None = None, new_tokens: int = 16, long_prompt: int | None = None,
                  repeats: int = 2, progress: Callable[[str], None] | None = None) -> list[dict]:
    """The table. `large_batch`: 32 on a CUDA GPU, 8 elsewhere; `long_prompt`: the chunked-prefill
    row's prompt, 2048 tokens on a GPU (at most the model's context less 64), 512 elsewhere;
    `repeats`: timed runs per measurement, the best kept.

    Off a GPU the rows run on one CPU thread: a small model's operations are too small to gain from
    being split across threads, and one thread's timings stay steady when other programs share the
    CPU (two threads then wait for each other at every operation)."""
    cuda = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type == "cuda"
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        return _rows(model, draft_model, device, cuda, large_batch, new_tokens, long_prompt, repeats, progress)
    finally:
        torch.set_num_threads(threads)


def _rows(model: str, draft_model: str | None, device: str | None, cuda: bool, large_batch: int | None,
          new_tokens: int, long_prompt: int | None, repeats: int,
          progress: Callable[[str], None] | None) -> list[dict]:
    large_batch = large_batch or (32 if cuda else 8)
    # The long prompt and the decodes behind it must fit the model's context (tiny's is 2048).
    context = read_model_config(resolve_model_path(model)).max_position_embeddings
    long_prompt = min(long_prompt or (2048 if cuda else 512), context - 64)
    report = progress or (lambda name: None)
    # A pool for the largest decode batch and the long prompt beside it, set outright: on a GPU the
    # default (a share of the memory, less what the process holds) would shrink with every engine
    # built before.
    blocks = large_batch * -(-(32 + new_tokens + 8) // 16) + -(-(long_prompt + 64) // 16) + 8
    common = {"device": device, "max_model_len": long_prompt + 64, "max_num_seqs": large_batch,
              "enable_prefix_caching": False, "num_kv_blocks": blocks}

    def engine(**options) -> LLM:
        return LLM(model, **{**common, **options})

    def decode(label: str, before: LLM, after: LLM, batch: int) -> tuple[float, float]:
        report(label)
        return paired_tokens_per_s(before, after, batch, new_tokens, repeats)

    rows = []
    base = engine()
    small = f"1 request, {new_tokens} new tokens"
    large = f"{large_batch} requests, {new_tokens} new tokens each"

    measured = decode("no KV cache", engine(kv_cache="none"), base, large_batch)
    rows.append(_row("KV cache", "kv_cache='none' -> 'paged'", large, "tokens/s", True, *measured))
    measured = decode("contiguous", engine(kv_cache="contiguous"), base, large_batch)
    rows.append(_row("paged KV cache", "kv_cache='contiguous' -> 'paged'", large, "tokens/s", True, *measured))

    report("prefix caching")
    # A group's first tokens come in one step of a few milliseconds on a GPU: five rounds, not one.
    prefix_rows, _ = bench_prefix_cache(model, num_requests=6, prefix_len=96, max_tokens=2, seed=0, rounds=5,
                                        device=device, max_model_len=256, num_kv_blocks=64)
    off, on = prefix_rows
    rows.append(_row("prefix caching", "enable_prefix_caching False -> True", "6 requests sharing a 96-token prefix",
                     "TTFT p50 ms", False, off["ttft_p50_ms"], on["ttft_p50_ms"]))

    report("chunked prefill")
    budget = 256 if cuda else 64
    whole = longest_stall_ms(engine(max_num_batched_tokens=long_prompt + 64), long_prompt)
    chunked = longest_stall_ms(engine(max_num_batched_tokens=budget), long_prompt)
    rows.append(_row("chunked prefill", f"max_num_batched_tokens {long_prompt + 64} -> {budget}",
                     f"a {long_prompt}-token prompt arrives while 4 requests decode",
                     "longest decode stall ms", False, whole, chunked))

    if cuda:
        measured = decode("attention backends", engine(attention_backend="torch"),
                          engine(attention_backend="triton"), large_batch)
        rows.append(_row("Triton attention", "attention_backend 'torch' -> 'triton'", large, "tokens/s", True,
                         *measured))
        measured = decode("CUDA graphs", engine(enforce_eager=True), base, 1)
        rows.append(_row("CUDA graphs", "enforce_eager True -> False", small, "tokens/s", True, *measured))
    else:
        rows.append(_row("Triton attention", "attention_backend 'torch' -> 'triton'", large, "tokens/s", True,
                         skipped=GPU_ONLY + " (Triton runs on a CPU only in its slow interpreter)"))
        rows.append(_row("CUDA graphs", "enforce_eager True -> False", small, "tokens/s", True,
                         skipped=GPU_ONLY + " (there are no CUDA graphs on a CPU)"))

    for method, options in (("int8", {"quantization": "int8"}), ("int4", {"quantization": "int4",
                                                                        "quant_group_size": 64})):
        quantized = engine(**options)
        for batch, label in ((1, small), (large_batch, large)):
            measured = decode(f"{method} weights, batch {batch}", base, quantized, batch)
            change = f"weights -> {method}" + (" (groups of 64)" if method == "int4" else "")
            rows.append(_row(f"{method.upper()} weights, batch {batch}", change, label, "tokens/s", True, *measured))

    int8_kv = engine(kv_cache_dtype="int8")
    measured = decode("int8 KV cache", base, int8_kv, large_batch)
    rows.append(_row("INT8 KV cache", "kv_cache_dtype 'auto' -> 'int8'", large, "tokens/s", True, *measured))
    gib = 1 << 30
    rows.append(_row("INT8 KV cache, capacity", "kv_cache_dtype 'auto' -> 'int8'", "1 GiB of KV memory",
                     "sequences of 4k tokens", True, _pool_sequences(base, gib, 4096, "auto"),
                     _pool_sequences(int8_kv, gib, 4096, "int8")))

    if draft_model is not None:
        speculating = engine(speculative_config={"model": draft_model, "num_speculative_tokens": 4})
        for batch, label in ((1, small), (large_batch, large)):
            measured = decode(f"speculation, batch {batch}", base, speculating, batch)
            rows.append(_row(f"speculative decoding, batch {batch}", f"draft {draft_model}, k=4", label, "tokens/s",
                             True, *measured))
    return rows
