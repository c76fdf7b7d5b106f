"""`minillm bench spec`: plain decoding against speculative decoding, side by side in one run.

For each batch size and temperature the same prompts are generated plainly and then with each
proposer and k: a draft model, prompt lookup (n-gram), and the target as its own draft (greedy, it
accepts everything, so that run measures what the machinery itself costs). Batch 1 is
BATCH1_REQUESTS requests one after another, as one user sends them: a single prompt's text may
repeat itself, and its drafts' acceptance with it (on an H200 one prompt had the shipped pair keep
exactly 3 of 4 drafts in nearly every verification). Each row reports:

- tokens per target call, measured (accepted drafts plus the target's token, per verification)
  and the formula (1 - alpha^(k+1)) / (1 - alpha) at the measured alpha (accepted / judged);
- c, the proposer's cost per draft token, and v, the rest of a speculative step (the target's
  verification, the rejection sampler), both in units of a plain decode step at that batch size,
  by the wall clock around `propose` in a second run of the same requests. On a GPU the draft's
  steps are only queued (the host reads its drafts with the target's tokens), so that clock alone
  would give c the host's part and v the rest of the draft's GPU time (v = 3.8 plain steps for
  k = 4 with the 1.1B model as its own draft on an H100, most of it the four draft steps'). The
  second run waits for the GPU on both sides of `propose`, so that each side's GPU work counts
  where it belongs;
- the speedup the cost model predicts, formula / (c k + v), beside the measured one: plain
  seconds over speculative seconds for the same requests, by the wall clock of the first run,
  which waits for nothing. Where a decode verified nothing (prompt lookup without a match) it
  counts as one token, not the formula. The model adds the two sides' costs; the first run
  overlaps the host's part of each with the GPU's, so on a GPU the measured speedup may beat the
  prediction by what that overlap saves;
- the same with the measured tokens per call in place of the formula's ("count / cost"): the
  cost side of the model alone, so that a miss of the prediction can be put on the formula (its
  one acceptance rate for every position, `spec_decode.acceptance.position_rates`) or on c and v.
"""

from __future__ import annotations

import functools
import time
from unittest import mock

import torch
from tqdm.auto import tqdm

from minillm import LLM, SamplingParams
from minillm.engine.trace import record
from minillm.eval.heldout import eval_token_ids
from minillm.models.loader import load_tokenizer, resolve_model_path
from minillm.spec_decode.acceptance import acceptance_stats

PROMPT_LEN = 32
BATCH1_REQUESTS = 4
COLUMNS = [("method", "method"), ("temperature", "temp"), ("batch", "batch"), ("k", "k"),
           ("tokens_per_s", "tokens/s"), ("speedup", "speedup"), ("predicted_speedup", "predicted"),
           ("alpha", "alpha"), ("acceptance_rate", "accepted/proposed"), ("tokens_per_call", "tokens/call"),
           ("expected_tokens_per_call", "formula"), ("count_over_cost", "count / cost"), ("c", "c"), ("v", "v")]


def methods(model: str, draft: str) -> dict[str, dict]:
    """Name -> speculative_config without k."""
    return {"draft_model": {"model": draft}, "ngram": {"method": "ngram", "prompt_lookup_max": 4,
                                                       "prompt_lookup_min": 2},
            "draft=target": {"model": model}}


def workload(model: str, batch: int, num_tokens: int, temperature: float) -> tuple[list[dict], list[SamplingParams]]:
    """batch held-out prompts of PROMPT_LEN tokens, from different places in the text; seeded when sampled."""
    ids = _heldout_ids(model)
    stride = (len(ids) - PROMPT_LEN) // batch
    prompts = [{"prompt_token_ids": ids[i * stride:i * stride + PROMPT_LEN]} for i in range(batch)]
    params = [SamplingParams(temperature=temperature, max_tokens=num_tokens, ignore_eos=True,
                             seed=i if temperature else None) for i in range(batch)]
    return prompts, params


@functools.cache
def _heldout_ids(model: str) -> list[int]:
    return eval_token_ids(load_tokenizer(resolve_model_path(model)))


def _serve_in_groups(llm: LLM, prompts: list[dict], params: list[SamplingParams], batch: int) -> list:
    """The requests `batch` at a time, each group once the one before has finished."""
    return [out for i in range(0, len(prompts), batch)
            for out in llm.generate(prompts[i:i + batch], params[i:i + batch], use_tqdm=False)]


def timed_generate(llm: LLM, prompts: list[dict], params: list[SamplingParams], batch: int) -> dict:
    """Seconds of serving the requests `batch` at a time, steps, and the trace's acceptance; with a
    proposer, also the seconds inside it and around it (split_seconds) of a second run that waits for
    the device on both sides of each `propose`."""
    llm.generate(prompts[:1], params[:1], use_tqdm=False)  # warm-up
    with record(llm) as trace:
        start = time.perf_counter()
        outs = _serve_in_groups(llm, prompts, params, batch)
        seconds = time.perf_counter() - start
    # Decodes of a sequence that verified nothing (prompt lookup found no match): one token each.
    plain_decodes = sum(1 for e in trace.events for s in e.seqs if s.decode_tokens and not s.spec_token_ids)
    run = {"seconds": seconds, "steps": len(trace.events), "plain_decodes": plain_decodes,
           "tokens": sum(len(o.outputs[0].token_ids) for o in outs), "stats": acceptance_stats(trace)}
    if llm.llm_engine.model_runner.proposer is not None:
        run.update(_split_run(llm, prompts, params, batch))
    return run


def _split_run(llm: LLM, prompts: list[dict], params: list[SamplingParams], batch: int) -> dict:
    """The same requests again, the device drained before and after each `propose`: its seconds
    (split_seconds), those inside `propose` (propose_seconds) and its steps (split_steps)."""
    proposer = llm.llm_engine.model_runner.proposer
    device = llm.llm_engine.device
    drain = torch.cuda.synchronize if device.type == "cuda" else lambda device: None
    proposing = [0.0]

    def propose(*args, _inner=proposer.propose):
        drain(device)
        start = time.perf_counter()
        proposal = _inner(*args)
        drain(device)
        proposing[0] += time.perf_counter() - start
        return proposal

    with record(llm) as trace, mock.patch.object(proposer, "propose", propose):
        start = time.perf_counter()
        _serve_in_groups(llm, prompts, params, batch)
        seconds = time.perf_counter() - start
    return {"split_seconds": seconds, "propose_seconds": proposing[0], "split_steps": len(trace.events)}


def bench_spec(model: str, draft: str, ks: list[int], batch_sizes: list[int], temperatures: list[float],
               num_tokens: int, method_names: list[str] | None = None, device: str | None = None,
               dtype: str = "auto") -> tuple[list[dict], dict]:
    # No prefix caching: each run of the same prompts (the speedup's, then c and v's) prefills them.
    engine_args = {"device": device, "dtype": dtype, "max_num_seqs": max(batch_sizes),
                   "max_model_len": PROMPT_LEN + num_tokens + 1, "enable_prefix_caching": False}
    configs = {name: config for name, config in methods(model, draft).items()
               if method_names is None or name in method_names}
    runs = [(name, k) for name in configs for k in ks]
    plain = LLM(model, **engine_args)
    engines = {run: LLM(model, speculative_config={**configs[run[0]], "num_speculative_tokens": run[1]},
                        **engine_args) for run in runs}
    rows = []
    with tqdm(total=len(temperatures) * len(batch_sizes) * (len(runs) + 1), desc="bench spec", leave=False) as bar:
        for temperature in temperatures:
            for batch in batch_sizes:
                requests = BATCH1_REQUESTS if batch == 1 else batch
                prompts, params = workload(model, requests, num_tokens, temperature)
                base = timed_generate(plain, prompts, params, batch)
                bar.update()
                step = base["seconds"] / base["steps"]  # a plain step at this batch size
                rows.append({"method": "plain", "temperature": temperature, "batch": batch, "k": 0,
                             "tokens_per_s": base["tokens"] / base["seconds"], "speedup": 1.0})
                for name, k in runs:
                    run = timed_generate(engines[name, k], prompts, params, batch)
                    bar.update()
                    rows.append(_row(name, k, temperature, batch, run, base, step))
    return rows, _summary(rows)


def _row(name: str, k: int, temperature: float, batch: int, run: dict, base: dict, plain_step: float) -> dict:
    stats = run["stats"]
    c = run["propose_seconds"] / run["split_steps"] / k / plain_step
    v = (run["split_seconds"] - run["propose_seconds"]) / run["split_steps"] / plain_step
    expected, counted = stats["expected_tokens_per_target_call"], stats["tokens_per_target_call"]
    verifies, plain = stats["drafts"], run["plain_decodes"]

    def per_decode(tokens: float | None) -> float | None:
        # Per decode of a sequence: `tokens` where it verified drafts, one token where it did not.
        return (tokens * verifies + plain) / (verifies + plain) if tokens else None

    return {"method": name, "temperature": temperature, "batch": batch, "k": k,
            "tokens_per_s": run["tokens"] / run["seconds"], "speedup": base["seconds"] / run["seconds"],
            "predicted_speedup": per_decode(expected) / (c * k + v) if expected else None,
            "count_over_cost": per_decode(counted) / (c * k + v) if counted else None,
            "alpha": stats["alpha"], "acceptance_rate": stats["acceptance_rate"],
            "tokens_per_call": stats["tokens_per_target_call"], "expected_tokens_per_call": expected, "c": c, "v": v}


def _summary(rows: list[dict]) -> dict:
    """The best k of each method, temperature and batch size, by measured speedup; and for each method
    and temperature, the smallest batch size measured where even the best k is slower than plain
    decoding (None: it paid at every batch size measured)."""
    best: dict[str, dict] = {}
    for row in rows:
        if row["method"] == "plain":
            continue
        key = f"{row['method']} temp={row['temperature']} batch={row['batch']}"
        if key not in best or row["speedup"] > best[key]["speedup"]:
            best[key] = {"k": row["k"], "speedup": row["speedup"], "predicted_speedup": row["predicted_speedup"]}
    stops_paying: dict[str, int | None] = {}
    for row in sorted((r for r in rows if r["method"] != "plain"), key=lambda r: r["batch"]):
        key = f"{row['method']} temp={row['temperature']}"
        losing = best[f"{key} batch={row['batch']}"]["speedup"] < 1
        stops_paying.setdefault(key, None)
        if losing and stops_paying[key] is None:
            stops_paying[key] = row["batch"]
    return {"best_k": best, "stops_paying_at_batch": stops_paying}
