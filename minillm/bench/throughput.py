"""`minillm bench throughput`: what continuous batching buys, against static batching and against
Hugging Face transformers, on one workload in one process.

Four systems serve the same requests, all submitted at once (offline), at most `batch_size` at a
time, greedy, each request generating exactly its own max_tokens (end-of-text is ignored, so that
every system does the same work):

- minillm, continuous batching: one engine; the batch is re-formed every step, so a finished
  request's slot goes to the next one at once;
- minillm, static batching: the same engine fed `batch_size` requests at a time, each group a
  fixed-shape batch run to completion before the next starts: every request of a group computes
  until the group's longest is done (what "static batching" means in the Orca paper, what
  FasterTransformer and transformers do); only each request's own tokens count. The same engine
  and the same groups as the transformers row, so that continuous against static measures the
  schedule alone, static against transformers the engine alone;
- minillm, static batching, draining: the same groups, but a finished request leaves its group, so
  the group gets cheaper as it drains where a step's cost grows with the batch (a CPU). Dropping
  finished requests every step is half of iteration-level scheduling (the admitting half is
  missing), so this row sits between the two schedules;
- transformers `generate` on the same static groups, prompts left-padded to the longest, the way a
  plain Hugging Face script batches.

Output lengths are heavy-tailed, as in real traffic (most answers short, a few long): exactly what
static batching handles worst. Latencies are measured from the moment everything was submitted.
Prefix caching is off: this benchmark is about scheduling.
"""

from __future__ import annotations

import math
import random
import time

import torch

from minillm.bench.latency import request_latencies, summarize
from minillm.eval.heldout import eval_token_ids
from minillm.llm import LLM
from minillm.models.loader import resolve_model_path
from minillm.sampling_params import SamplingParams

COLUMNS = [("system", "system"), ("tokens_per_s", "tokens/s"), ("ttft_p50_ms", "TTFT p50 ms"),
           ("ttft_p95_ms", "TTFT p95 ms"), ("tpot_p50_ms", "TPOT p50 ms"), ("tpot_p95_ms", "TPOT p95 ms"),
           ("e2e_p95_ms", "e2e p95 ms"), ("seconds", "seconds"), ("vs_transformers", "x transformers"),
           ("same_tokens", "same tokens as continuous")]
Request = tuple[list[int], int]  # prompt token ids, tokens to generate


def heavy_tailed_workload(token_ids: list[int], num_requests: int, max_prompt: int, max_output: int,
                          seed: int) -> list[Request]:
    """Prompts cut from held-out text; prompt and output lengths log-normal (medians 64 and 48
    tokens, sigma 1, so the 95th percentile is about 5x the median), clipped to [4, max]."""
    rng = random.Random(seed)

    def length(median: int, cap: int) -> int:
        return max(4, min(cap, int(rng.lognormvariate(math.log(median), 1.0))))

    requests = []
    for _ in range(num_requests):
        prompt_len = length(64, max_prompt)
        start = rng.randrange(len(token_ids) - prompt_len)
        requests.append((token_ids[start:start + prompt_len], length(48, max_output)))
    return requests


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def run_minillm(llm: LLM, requests: list[Request], batch_size: int, schedule: str) -> tuple[dict, list]:
    """schedule: "continuous" (everything submitted at once), "static" (fixed-shape groups: every
    request of a group generates as many tokens as the group's longest; only its own tokens are kept)
    or "static-draining" (groups run to completion; a finished request leaves its group)."""
    prompts = [{"prompt_token_ids": p} for p, _ in requests]
    groups = [range(len(requests))] if schedule == "continuous" else [
        range(i, min(i + batch_size, len(requests))) for i in range(0, len(requests), batch_size)]
    start = time.time()
    outputs = []
    for group in groups:
        longest = max(requests[i][1] for i in group)
        params = [greedy(longest if schedule == "static" else requests[i][1]) for i in group]
        outputs += llm.generate([prompts[i] for i in group], params, use_tqdm=False)
    seconds = time.time() - start
    tokens = [o.outputs[0].token_ids[:n] for o, (_, n) in zip(outputs, requests)]
    return summarize([request_latencies(o, start) for o in outputs], sum(map(len, tokens)), seconds), tokens


def run_transformers(model_path, requests: list[Request], batch_size: int, dtype: torch.dtype,
                     device: torch.device) -> tuple[dict, list]:
    from transformers import AutoModelForCausalLM, LogitsProcessor

    class StepClock(LogitsProcessor):
        """Called once per generated position, right after the forward pass that produced it."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):
            self.times.append(time.time())
            return scores

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    pad = model.generation_config.pad_token_id or 0
    latencies, tokens = [], []
    start = time.time()
    for first in range(0, len(requests), batch_size):
        group = requests[first:first + batch_size]
        began = time.time()
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in group], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group], device=device)
        longest = max(n for _, n in group)
        clock = StepClock()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                                 do_sample=False, pad_token_id=pad, logits_processor=[clock])
        for row, (_, n) in enumerate(group):
            tokens.append(out[row, width:width + n].tolist())
            done = clock.times[n - 1]
            latencies.append({"queue": began - start, "ttft": clock.times[0] - start,
                              "tpot": (done - clock.times[0]) / (n - 1) if n > 1 else math.nan,
                              "e2e": done - start})
    seconds = time.time() - start
    return summarize(latencies, sum(n for _, n in requests), seconds), tokens


def bench_throughput(model: str, num_requests: int, batch_size: int, max_prompt: int, max_output: int,
                     seed: int, **engine_args) -> tuple[list[dict], dict]:
    llm = LLM(model, max_num_seqs=batch_size, max_model_len=max_prompt + max_output, enable_prefix_caching=False,
              **engine_args)
    engine = llm.llm_engine
    requests = heavy_tailed_workload(eval_token_ids(llm.get_tokenizer()), num_requests, max_prompt, max_output,
                                     seed)
    warmup = requests[:2]
    run_minillm(llm, warmup, batch_size, "continuous")
    continuous, reference = run_minillm(llm, requests, batch_size, "continuous")
    static, static_tokens = run_minillm(llm, requests, batch_size, "static")
    draining, draining_tokens = run_minillm(llm, requests, batch_size, "static-draining")
    path = resolve_model_path(model)
    run_transformers(path, warmup, batch_size, engine.dtype, engine.device)
    hf, hf_tokens = run_transformers(path, requests, batch_size, engine.dtype, engine.device)
    rows = []
    for name, result, tokens in (("minillm continuous", continuous, reference),
                                 ("minillm static", static, static_tokens),
                                 ("minillm static, draining", draining, draining_tokens),
                                 ("transformers generate", hf, hf_tokens)):
        same = sum(a == b for a, b in zip(tokens, reference))
        rows.append({"system": name, **result, "vs_transformers": result["tokens_per_s"] / hf["tokens_per_s"],
                     "same_tokens": f"{same}/{len(requests)}"})
    summary = {"continuous_over_static": continuous["tokens_per_s"] / static["tokens_per_s"],
               "continuous_over_static_draining": continuous["tokens_per_s"] / draining["tokens_per_s"],
               "continuous_over_transformers": continuous["tokens_per_s"] / hf["tokens_per_s"],
               "output_tokens": continuous["output_tokens"],
               "prompt_tokens": sum(len(p) for p, _ in requests), "device": str(engine.device),
               "dtype": str(engine.dtype).replace("torch.", "")}
    return rows, summary
