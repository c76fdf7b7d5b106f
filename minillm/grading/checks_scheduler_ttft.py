"""Exercise 04, part 3's last check: the learner's policy against first come, first served on a
virtual clock (bench/virtual_clock.py), so that its TTFT is the same on every machine. Two engines
replay the same workloads, one with the engine's default policy and one with the learner's
`admit_shortest_first` as its scheduling policy's admission step.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from minillm.bench.virtual_clock import StepCost, TimedRequest, replay, summarize, workload
from minillm.engine.policy import SchedulingPolicy
from minillm.grading.checks_scheduler_policy import POLICY, call_policy
from minillm.grading.feedback import CheckFailed
from minillm.llm import LLM

# A GPU-like step (5 ms, and 0.1 ms per token) and an engine whose queue grows.
COST = StepCost(fixed=0.005, per_token=0.0001)
POLICY_ENGINE = {"dtype": "float32", "max_num_seqs": 8, "max_num_batched_tokens": 32, "max_model_len": 256,
                 "enable_prefix_caching": False}
LONG_WAIT_MS = 350  # the most the long prompt of stream_workload may wait for its first token
TEXT_TOKENS = 16384  # of held-out text the workloads cut their prompts from
TTFT_GAIN = 0.75  # the policy's TTFT p50 on mixed_workload, at most this fraction of FCFS's


def _text_ids(llm: LLM) -> list[int]:
    """Held-out text cut to a fixed length: the workloads draw their lengths from one random stream,
    and a text of another length would change the draws, so every model gets the same lengths."""
    from minillm.eval.heldout import eval_token_ids

    return eval_token_ids(llm.get_tokenizer())[:TEXT_TOKENS]


def mixed_workload(llm: LLM) -> list[TimedRequest]:
    """Chat turns (prompts of 4 to 16 tokens) and, three times in ten, documents (64 to 160 tokens),
    arriving at 200 per second for 0.3 s, each generating 8 tokens: more at once than POLICY_ENGINE
    serves, so a queue forms."""
    return workload(_text_ids(llm), rate=200, duration=0.3, long_fraction=0.3, short=(4, 16, 8), long=(64, 160, 8),
                    seed=0)


def stream_workload(llm: LLM) -> list[TimedRequest]:
    """A 160-token prompt (the first request) arriving at 0.1 s into a stream of short ones (4 to 16
    tokens), one every 5 ms for 0.5 s, faster than the engine serves them: from then on the queue
    always holds a shorter one."""
    text = _text_ids(llm)
    rng = random.Random(1)
    stream = []
    for i in range(100):
        length = rng.randint(4, 16)
        start = rng.randrange(len(text) - length)
        stream.append(TimedRequest(i * 0.005, text[start:start + length], 8))
    return [TimedRequest(0.1, text[:160], 8), *stream]


def check_policy_ttft(policy: Callable, model: str = "tiny", device: str | None = None) -> dict:
    """Your policy on the virtual clock: the long prompt in a stream of short ones is served in
    time, and on a mixed workload TTFT p50 beats first come, first served. Returns the mixed
    workload's rows and timings (for the table in the exercise)."""
    mine = LLM(model, device=device, **POLICY_ENGINE, scheduling_policy=SchedulingPolicy(
        admit=lambda scheduler, batch, budget: call_policy(policy, scheduler, batch, budget, "a call from the engine")))
    long = replay(mine.llm_engine, stream_workload(mine), COST)[0]
    if long.ttft * 1e3 > LONG_WAIT_MS:
        raise CheckFailed(f"{POLICY} starves long prompts: a 160-token prompt arriving in a stream of short ones "
                          f"waited {long.ttft * 1e3:.0f} ms for its first token (at most {LONG_WAIT_MS} ms: first "
                          "come, first served takes about 80 ms, shortest first without aging about 620 ms, when the "
                          "stream ends)\n  hint: age faster: a step takes about 8 ms here, so how many steps may a "
                          "request wait before it goes ahead of fresh short prompts?")
    requests = mixed_workload(mine)
    rows, timings = {}, {}
    for name, llm in (("first come, first served", LLM(model, device=device, **POLICY_ENGINE)), (POLICY, mine)):
        timings[name] = replay(llm.llm_engine, requests, COST)
        rows[name] = summarize(timings[name], {})
    fcfs, ours = rows["first come, first served"], rows[POLICY]
    if ours["completed"] != ours["requests"]:
        raise CheckFailed(f"with {POLICY}, only {ours['completed']} of {ours['requests']} requests finished")
    if ours["ttft_p50_ms"] > TTFT_GAIN * fcfs["ttft_p50_ms"]:
        raise CheckFailed(f"with {POLICY}, TTFT p50 is {ours['ttft_p50_ms']:.0f} ms on the mixed workload, against "
                          f"{fcfs['ttft_p50_ms']:.0f} ms first come, first served: it should be at most "
                          f"{TTFT_GAIN:.0%} of it\n  hint: short prompts should pass long ones that have not "
                          "waited long; does your aging make everyone first come, first served after a few steps?")
    print(f"check_policy_ttft passed: the long prompt in a stream of short ones waited {long.ttft * 1e3:.0f} ms "
          f"(at most {LONG_WAIT_MS}); on the mixed workload TTFT p50 {ours['ttft_p50_ms']:.0f} ms against "
          f"{fcfs['ttft_p50_ms']:.0f} ms first come, first served")
    return {"rows": rows, "timings": timings, "requests": requests}
