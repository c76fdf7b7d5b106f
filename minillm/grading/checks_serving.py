"""Checks for exercise 07, serving: the learner's `token_budget(scheduler, cost, tpot_slo) -> int`,
the tokens a step may compute so that decodes keep their time-per-output-token target.

Part 1 asks it about hand-made scheduler states, each built to catch one usual mistake. Part 2
replays a fixed workload of short chat turns and long prompts through the real engine on a virtual
clock (bench/virtual_clock.py), with first-come-first-served's full budget and then with the
learner's, and compares goodput against the SLO. Part 3 puts the rule into a real server under a
burst of concurrent requests: every request must come back, with the text plain decoding gives.
The rule goes into an engine as the token budget of its scheduling policy (the engine argument
`scheduling_policy`); the engine it is compared with keeps the default one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from minillm.bench.virtual_clock import StepCost, replay, summarize, workload
from minillm.config.engine import SchedulerConfig
from minillm.engine.policy import SchedulingPolicy
from minillm.engine.scheduler import Scheduler
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence

# A GPU-like step: 5 ms whatever its size, and 0.1 ms per token computed.
COST = StepCost(fixed=0.005, per_token=0.0001)
TPOT_SLO = 0.020  # seconds
SLO = {"ttft": 500, "tpot": TPOT_SLO * 1e3}  # milliseconds, as `minillm bench serve --goodput` takes it
ENGINE = {"dtype": "float32", "max_num_seqs": 16, "max_num_batched_tokens": 512, "enable_prefix_caching": False}
RULE = ("with no decode running, the whole max_num_batched_tokens (nobody's TPOT is at stake, and a long prompt "
        "finishes sooner); otherwise the largest step cost(n) <= tpot_slo allows, but at least one token per "
        "decode plus one (prompts must keep moving), and never more than max_num_batched_tokens")


@dataclass(frozen=True)
class Case:
    title: str
    decodes: int  # running sequences with one token to compute
    prefilling: int  # running sequences still in their prompt
    waiting: int
    max_num_batched_tokens: int
    tpot_slo: float
    expected: int
    mistake: str  # what a wrong answer here usually means
    recomputing: int = 0  # running sequences preempted before, computing their prompt and output again


def cases() -> list[Case]:
    fit = COST.tokens_within(TPOT_SLO)  # 150
    return [
        Case("nothing running, three requests waiting", 0, 0, 3, 512, TPOT_SLO, 512,
             "with no decode running there is no TPOT to protect: give prompts the whole max_num_batched_tokens"),
        Case("a prompt being prefilled alone", 0, 1, 0, 512, TPOT_SLO, 512,
             "a sequence still in its prompt is not a decode: it has no TPOT yet"),
        Case("four decodes running", 4, 0, 2, 512, TPOT_SLO, fit,
             f"the step may take tpot_slo = {TPOT_SLO * 1e3:.0f} ms: cost(n) = fixed + per_token * n, so "
             "n = (tpot_slo - fixed) / per_token, rounded down; did you leave out the fixed part, or round up?"),
        Case("four decodes and a long prompt half prefilled", 4, 1, 0, 512, TPOT_SLO, fit,
             "count only the decodes: the prompt being prefilled is what the budget holds back"),
        Case("a preempted sequence computing its prompt and output again, alone", 0, 0, 1, 512, TPOT_SLO, 512,
             "a sequence recomputed after preemption has generated tokens but computes many at once: it is not "
             "a decode; count the running sequences with exactly one token left to compute", recomputing=1),
        Case("a target looser than the step limit", 4, 0, 2, 128, TPOT_SLO, 128,
             "never more than scheduler.max_num_batched_tokens"),
        Case("a target so tight that no prompt token fits", 8, 0, 3, 512, 0.0054, 9,
             "at least one token per decode plus one, or prompts (and so requests) would wait forever"),
        Case("a target below the fixed cost of a step", 3, 0, 1, 512, 0.004, 4,
             "(tpot_slo - fixed) is negative here: still one token per decode plus one"),
        Case("two decodes and a 7.5 ms target", 2, 0, 1, 512, 0.0075, 25,
             "tpot_slo and the cost model are both in seconds"),
        # The other targets leave a whole number of tokens; this one does not, so rounding shows.
        Case("three decodes and a 12.37 ms target, where 73.7 tokens fit", 3, 0, 1, 512, 0.01237, 73,
             "a step of 74 tokens takes 5 + 7.4 = 12.4 ms, past the target: round (tpot_slo - fixed) / per_token "
             "down (math.floor), not to the nearest, nor up"),
    ]


def accepted(case: Case) -> set[int]:
    """The case's budget, and the one a division that lands a hair below a whole number gives:
    (0.020 - 0.005) / 0.0001 is 149.99999999999997 in floating point."""
    naive = math.floor((case.tpot_slo - COST.fixed) / COST.per_token)
    clamped = min(case.max_num_batched_tokens, max(case.decodes + 1, naive)) if case.decodes else case.expected
    return {case.expected, clamped}


def _scheduler(case: Case) -> Scheduler:
    """A scheduler holding the case's sequences; no model or cache is needed to ask for a budget."""
    config = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=case.max_num_batched_tokens)
    scheduler = Scheduler(config, kv_cache_manager=None)
    params = SamplingParams(max_tokens=16)
    for i in range(case.decodes + case.prefilling + case.waiting):
        seq = Sequence(f"r{i}", prompt_token_ids=range(1, 41), params=params)
        if i < case.decodes:
            seq.token_ids.append(7)  # its prompt is in the cache, and it generated one token
            seq.num_computed_tokens = 40
        elif i < case.decodes + case.prefilling:
            seq.num_computed_tokens = 16  # one chunk of 16 of its 40 prompt tokens
        (scheduler.running if i < case.decodes + case.prefilling else scheduler.waiting).append(seq)
    for i in range(case.recomputing):  # 5 tokens generated, then preempted: nothing of it is computed
        seq = Sequence(f"p{i}", prompt_token_ids=range(1, 41), params=params)
        seq.token_ids += [7, 8, 9, 10, 11]
        scheduler.running.append(seq)
    return scheduler


def check_token_budget(token_budget: Callable[[Scheduler, StepCost, float], int]) -> None:
    for case in cases():
        scheduler = _scheduler(case)
        before = [(s.request_id, s.num_computed_tokens) for s in scheduler.running]
        got = call_learner(token_budget, "token_budget", f"the case '{case.title}'", scheduler, COST, case.tpot_slo)
        if isinstance(got, bool) or not isinstance(got, int):
            raise CheckFailed(f"token_budget returned {got!r} ({type(got).__name__}) for '{case.title}': it must "
                              "return an int, a number of tokens (math.floor, or int() of a non-negative number)")
        if [(s.request_id, s.num_computed_tokens) for s in scheduler.running] != before:
            raise CheckFailed("token_budget changed scheduler.running: it must only read the scheduler's state")
        if got not in accepted(case):
            raise CheckFailed(f"'{case.title}' (cost: {COST.fixed * 1e3:.0f} ms + {COST.per_token * 1e3:.1f} ms per "
                              f"token, tpot_slo = {case.tpot_slo * 1e3:g} ms, max_num_batched_tokens = "
                              f"{case.max_num_batched_tokens}): expected {case.expected}, got {got}\n"
                              f"  hint: {case.mistake}\n  the rule: {RULE}")
    print(f"check_token_budget passed: {len(cases())} scheduler states, each with the budget the rule gives")


def _policy(token_budget: Callable[[Scheduler, StepCost, float], int], caller: str) -> SchedulingPolicy:
    """The learner's rule, at COST and TPOT_SLO, as the budget of an engine's scheduling policy."""
    return SchedulingPolicy(token_budget=lambda scheduler: call_learner(
        token_budget, "token_budget", f"a call from the {caller}", scheduler, COST, TPOT_SLO))


def goodput_workload(llm: LLM):
    """Short chat turns and long prompts arriving at 30 per second for 0.8 s: 23 requests."""
    from minillm.eval.heldout import eval_token_ids

    return workload(eval_token_ids(llm.get_tokenizer()), rate=30, duration=0.8, long_fraction=0.3,
                    short=(16, 48, 24), long=(400, 500, 4), seed=0)


def check_goodput(token_budget: Callable[[Scheduler, StepCost, float], int], llm: LLM) -> dict:
    """Your rule against first come, first served with the whole budget (llm, an engine of ENGINE's
    settings), on the same workload and virtual clock; returns both rows (for a table)."""
    requests = goodput_workload(llm)
    engine = llm.llm_engine
    yours = LLM(engine.model_name, device=engine.device, **ENGINE, scheduling_policy=_policy(token_budget, "engine"))
    try:  # the learner's first: a rule that stalls the engine is told so without waiting for the baseline
        mine = summarize(replay(yours.llm_engine, requests, COST), SLO)
        fcfs = summarize(replay(engine, requests, COST), SLO)
    except RuntimeError as e:
        raise CheckFailed(f"with your token_budget, {e}\n  the rule: {RULE}") from None
    if mine["completed"] != mine["requests"]:
        raise CheckFailed(f"with your token_budget only {mine['completed']} of {mine['requests']} requests finished")
    if mine["slo_attained"] < fcfs["slo_attained"] + 0.1:
        raise CheckFailed(f"with your token_budget {mine['slo_attained']:.0%} of requests met the SLO (TTFT <= "
                          f"{SLO['ttft']:.0f} ms, TPOT <= {SLO['tpot']:.0f} ms), against {fcfs['slo_attained']:.0%} "
                          f"with the whole budget every step: it should do clearly better (TPOT p95 "
                          f"{mine['tpot_p95_ms']:.1f} ms, against {fcfs['tpot_p95_ms']:.1f} ms)\n  the rule: {RULE}")
    print(f"check_goodput passed: {mine['slo_attained']:.0%} of requests within the SLO with your budget, "
          f"against {fcfs['slo_attained']:.0%} first come, first served")
    return {"fcfs": fcfs, "token_budget": mine}


def check_server(token_budget: Callable[[Scheduler, StepCost, float], int], model: str = "tiny",
                 device: str | None = None) -> None:
    """Your rule scheduling a real server's engine, the goodput workload's requests sent all at once."""
    import openai

    from minillm.entrypoints.background import BackgroundServer

    llm = LLM(model, device=device, **ENGINE)
    requests = goodput_workload(llm)
    prompts = [r.prompt_token_ids for r in requests]
    lengths = [r.max_tokens for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    expected = [o.outputs[0].text for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                        use_tqdm=False)]

    def burst(base_url: str) -> list[str]:
        """All at once, a thread per request (asyncio.run is not allowed inside a notebook's own loop)."""
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)

        def send(prompt: list[int], max_tokens: int) -> str:
            return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(send, prompts, lengths))

    with BackgroundServer(model, device=device, **ENGINE, scheduling_policy=_policy(token_budget, "server")) as server:
        engine = server.engine.llm_engine
        try:
            got = burst(server.base_url)
        except openai.APIError as e:
            raise CheckFailed(f"a request to the server failed with your token_budget in its engine: {e}") from None
        held = engine.block_manager.num_blocks - engine.block_manager.num_free_blocks
    wrong = [i for i, (a, b) in enumerate(zip(expected, got)) if a != b]
    if wrong:
        raise CheckFailed(f"requests {wrong} came back with other text than plain decoding gives: a token budget "
                          "decides when tokens are computed, never which")
    if held:
        raise CheckFailed(f"{held} KV blocks were still held after every request finished")
    print(f"check_server passed: {len(prompts)} concurrent requests served with your budget, each with the text "
          "plain decoding gives, and no KV block left held")
