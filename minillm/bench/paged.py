"""`minillm bench paged`: what paging buys, measured on the engine itself.

1. Memory: the same mixed-length workload through the paged and the contiguous cache; per step,
   KV memory in use over memory reserved. A contiguous cache reserves prompt + max_tokens for each
   request when it starts; paging reserves whole blocks only as tokens arrive.
2. Capacity: both caches get the same fixed KV budget; how many sequences run at once while
   requests wait for memory, and how many steps the workload takes.
3. Prefix caching: requests sharing a long prompt prefix (a system prompt); prefill tokens actually
   computed and time to first token, with prefix caching on and off: once with the prefix already in
   the cache, once with all the requests arriving together at an empty cache (a burst).

The workload imitates code completion: prompts cut from held-out source, a generous cap on new
tokens (max_tokens), and completions that end earlier, at the end of a line once a drawn minimum
length is reached. Everything is seeded (each request samples with its own seed), so outputs must
not depend on the cache.
"""

from __future__ import annotations

import random
import statistics
import time

from minillm.engine.trace import Trace, record
from minillm.eval.heldout import eval_token_ids
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams

MAX_PROMPT_TOKENS = 512

MEMORY_COLUMNS = [("cache", "cache"), ("kv_used_over_reserved", "KV used / reserved"),
                  ("peak_reserved_tokens", "peak reserved tokens"),
                  ("running_under_backlog", "running (queue not empty)"), ("peak_running", "peak running"),
                  ("preemptions", "preemptions"), ("steps", "steps"), ("same_tokens", "same tokens")]
PREFIX_COLUMNS = [("arrival", "arrival"), ("prefix_caching", "prefix caching"),
                  ("prefill_tokens", "prefill tokens computed"), ("cached_tokens", "prefix-hit tokens"),
                  ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_mean_ms", "TTFT mean ms"), ("seconds", "seconds"),
                  ("same_tokens", "same tokens")]


def mixed_workload(token_ids: list[int], num_requests: int, max_tokens: int, seed: int = 0
                   ) -> list[tuple[list[int], SamplingParams]]:
    """Prompts of 32 to 512 tokens; completions stop at the first newline after a minimum drawn
    from 16 to 256 tokens; both log-uniform (most are short, a few long, as in chat traces such as
    ShareGPT), under a cap of max_tokens."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = int(2 ** rng.uniform(5, 9))  # < MAX_PROMPT_TOKENS
        start = rng.randrange(len(token_ids) - prompt_len)
        # Seeded sampling: greedy decoding of a small model often loops on one token forever, and
        # a seeded request samples the same tokens whatever else is in the batch.
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=rng.randrange(2**31), max_tokens=max_tokens,
                                min_tokens=min(max_tokens, int(2 ** rng.uniform(4, 8))), stop="\n", ignore_eos=True)
        requests.append((token_ids[start:start + prompt_len], params))
    return requests


def run(llm: LLM, requests: list[tuple[list[int], SamplingParams]]) -> tuple[Trace, list]:
    with record(llm) as trace:
        outs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], [s for _, s in requests],
                            use_tqdm=False)
    return trace, outs


def memory_row(cache: str, trace: Trace, outs: list, reference: list) -> dict:
    used = sum(e.kv_tokens for e in trace.events)
    reserved = sum(e.kv_reserved_tokens for e in trace.events)
    # How many sequences the memory holds is what runs while requests are still queued for it; once
    # the queue is empty, the run drains and the count says nothing about the cache.
    backlogged = [len(e.seqs) for e in trace.events if e.num_waiting > 0]
    return {"cache": cache, "kv_used_over_reserved": used / reserved,
            "peak_reserved_tokens": max(e.kv_reserved_tokens for e in trace.events),
            "running_under_backlog": statistics.fmean(backlogged) if backlogged else None,
            "peak_running": max(len(e.seqs) for e in trace.events),
            "preemptions": sum(len(e.preempted) for e in trace.events), "steps": len(trace.events),
            "same_tokens": [o.outputs[0].token_ids for o in outs] == reference}


def bench_memory(model: str, num_requests: int, max_tokens: int, budget_blocks: int, block_size: int,
                 seed: int, **engine_args) -> tuple[list[dict], dict]:
    # The longest sequence the workload can make; a pool must hold one of them.
    engine_args = {"block_size": block_size, "max_model_len": MAX_PROMPT_TOKENS + max_tokens, **engine_args}
    llms = {cache: LLM(model, kv_cache=cache, **engine_args) for cache in ("paged", "contiguous")}
    requests = mixed_workload(eval_token_ids(llms["paged"].get_tokenizer()), num_requests, max_tokens, seed)
    reference = None
    rows = []
    for budget in (None, budget_blocks):
        for cache, llm in llms.items():
            if budget is not None:
                llm = LLM(model, kv_cache=cache, num_kv_blocks=budget, **engine_args)
            trace, outs = run(llm, requests)
            tokens = [o.outputs[0].token_ids for o in outs]
            reference = reference or tokens
            label = cache if budget is None else f"{cache}, {budget * block_size}-token budget"
            rows.append(memory_row(label, trace, outs, reference))
    unlimited, limited = rows[:2], rows[2:]
    summary = {
        "paged_kv_utilisation": unlimited[0]["kv_used_over_reserved"],
        "contiguous_kv_utilisation": unlimited[1]["kv_used_over_reserved"],
        "budget_tokens": budget_blocks * block_size,
        "running_under_backlog_ratio": limited[0]["running_under_backlog"] / limited[1]["running_under_backlog"],
        "peak_running_ratio": limited[0]["peak_running"] / limited[1]["peak_running"],
        "steps_ratio": limited[1]["steps"] / limited[0]["steps"],
        "all_outputs_identical": all(r["same_tokens"] for r in rows),
        "output_tokens": sum(len(t) for t in reference), "prompt_tokens": sum(len(p) for p, _ in requests),
    }
    return rows, summary


def bench_prefix_cache(model: str, num_requests: int, prefix_len: int, max_tokens: int, seed: int, rounds: int = 1,
                       together: bool = False, **engine_args) -> tuple[list[dict], dict]:
    """One request arrives first and leaves its prompt in the cache; the others then arrive
    together. Each prompt is the shared prefix plus a suffix of its own (8 to 32 tokens). The group
    arrives `rounds` times, with new suffixes each time, at the engine without the cache and the one
    with it by turns: the requests of a group get their first tokens in one step, so a round is one
    sample of that step's time, and where the step takes a few milliseconds one sample is at the
    mercy of whatever else the machine does.

    together: no request goes first; all num_requests arrive together at an empty cache every round
    (a burst): the prefix is shared only if the step that computes it for one request shares it with
    the others (engine/scheduler.py)."""
    rng = random.Random(seed)
    engines = {caching: LLM(model, enable_prefix_caching=caching, **engine_args) for caching in (False, True)}
    text = eval_token_ids(engines[False].get_tokenizer())
    start = rng.randrange(len(text) - prefix_len)
    prefix = text[start:start + prefix_len]

    def group(size: int) -> list[list[int]]:
        spans = [(rng.randrange(len(text) - 32), rng.randint(8, 32)) for _ in range(size)]
        return [prefix + text[s:s + n] for s, n in spans]

    if together:
        first, groups = [], [group(num_requests) for _ in range(rounds)]
    else:
        first, groups = group(1), [group(num_requests - 1) for _ in range(rounds)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    stats = {caching: {"ttft": [], "tokens": [], "prefill": 0, "cached": 0, "seconds": 0.0} for caching in engines}

    def serve(caching: bool, prompts: list[list[int]], timed: bool) -> None:
        llm, stat = engines[caching], stats[caching]
        if together:
            llm.llm_engine.block_manager.reset()  # an empty cache: nothing left from the round before
        begin = time.perf_counter()
        with record(llm) as trace:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stat["seconds"] += time.perf_counter() - begin
        stat["prefill"] += sum(s.prefill_tokens for e in trace.events for s in e.seqs)
        stat["cached"] += sum(o.num_cached_tokens for o in outs)
        stat["tokens"] += [o.outputs[0].token_ids for o in outs]
        if timed:
            stat["ttft"] += [(o.metrics.first_token_time - o.metrics.arrival_time) * 1000 for o in outs]

    if first:  # to both engines alike; the one with prefix caching keeps the prefix in its cache
        for caching in engines:
            serve(caching, first, timed=False)
    for prompts in groups:
        for caching in engines:
            serve(caching, prompts, timed=True)
    arrival = "all together" if together else "after the first"
    rows = [{"arrival": arrival, "prefix_caching": "on" if caching else "off", "prefill_tokens": stat["prefill"],
             "cached_tokens": stat["cached"], "ttft_p50_ms": statistics.median(stat["ttft"]),
             "ttft_mean_ms": statistics.fmean(stat["ttft"]), "seconds": stat["seconds"],
             "same_tokens": stat["tokens"] == stats[False]["tokens"]} for caching, stat in stats.items()]
    off, on = rows
    summary = {"prefill_tokens_saved": 1 - on["prefill_tokens"] / off["prefill_tokens"],
               "ttft_p50_speedup": off["ttft_p50_ms"] / on["ttft_p50_ms"],
               "all_outputs_identical": all(r["same_tokens"] for r in rows),
               "num_requests": num_requests, "prefix_len": prefix_len, "rounds": rounds, "together": together}
    return rows, summary
