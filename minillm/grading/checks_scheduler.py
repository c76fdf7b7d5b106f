"""Checks for exercise 04, continuous batching: the learner's admission steps, `admit(scheduler,
batch, budget)` (first come, first served) and a policy of their own design (shortest prompt first,
with aging), each called by the scheduler once per step to move waiting requests into the batch.

`check_admit` drives two schedulers in lockstep through the same workload (requests arriving over
time, a small KV pool that forces preemption, a small token budget that forces chunked prefill), one
with the reference `admit` and one with the learner's, hands both what a model would have produced
(`Scheduler.update`), and compares the batch and the queues after every step, so that a message can
say which step went wrong and which rule was broken.

A policy has no reference to compare with, so `check_policy` asks it about hand-made queues (who
goes first) and checks the rules every admission step keeps on the same random workloads;
`check_policy_engine` generates with it; `check_policy_ttft` replays workloads through the real
engine on a virtual clock (bench/virtual_clock.py), so that its TTFT is the same on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from minillm.bench.virtual_clock import StepCost, TimedRequest, replay, summarize, workload
from minillm.config.engine import SchedulerConfig
from minillm.engine.runner_output import ModelRunnerOutput
from minillm.engine.scheduler import ScheduledBatch, Scheduler
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner
from minillm.kv.block_manager import BlockManager
from minillm.kv.manager import PagedKVCacheManager
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams
from minillm.sequence import Sequence, SequenceStatus

BLOCK_SIZE = 4
SEEDS = (0, 1, 2, 3, 4, 93)  # 93: a preempted victim would fit again at once, through its cached prefix
RULES = ("a request joins only while the step has budget left, fewer than max_num_seqs run and this step "
         "preempted nobody; it needs KV memory first (scheduler.allocate), and when the oldest waiting "
         "request gets none, nobody behind it joins either; a request that joins leaves waiting, goes to the "
         "end of running and into the batch, computing what the budget left allows (a chunk of a long prompt)")
POLICY = "admit_shortest_first"
# The policy's replays: a GPU-like step (5 ms, and 0.1 ms per token) and an engine whose queue grows.
COST = StepCost(fixed=0.005, per_token=0.0001)
POLICY_ENGINE = {"dtype": "float32", "max_num_seqs": 8, "max_num_batched_tokens": 32, "max_model_len": 256,
                 "enable_prefix_caching": False}
LONG_WAIT_MS = 350  # the most the long prompt of stream_workload may wait for its first token
TEXT_TOKENS = 16384  # of held-out text the workloads cut their prompts from
TTFT_GAIN = 0.75  # the policy's TTFT p50 on mixed_workload, at most this fraction of FCFS's


def _workload(seed: int) -> tuple[dict, list[tuple[int, list[int], int]]]:
    """Scheduler limits, and requests as (arrival step, prompt, max_tokens)."""
    rng = random.Random(seed)
    limits = {"max_num_seqs": rng.randint(2, 4), "max_num_batched_tokens": rng.choice([6, 10, 16]),
              "num_blocks": rng.randint(10, 16)}
    shared = [rng.randrange(50) for _ in range(12)]  # a common beginning: prefix-cache hits, shared blocks
    requests = [(rng.randrange(12), shared[:rng.randrange(13)] + [rng.randrange(50) for _ in range(rng.randint(1, 12))],
                 rng.randint(1, 12)) for _ in range(rng.randint(6, 10))]
    return limits, sorted(requests, key=lambda r: r[0])


def _scheduler(limits: dict) -> Scheduler:
    return Scheduler(SchedulerConfig(limits["max_num_seqs"], limits["max_num_batched_tokens"]),
                     PagedKVCacheManager(BlockManager(limits["num_blocks"], BLOCK_SIZE)))


def _describe(seed: int, limits: dict, requests: list) -> str:
    return (f"workload seed {seed}: {len(requests)} requests, max_num_seqs={limits['max_num_seqs']}, "
            f"max_num_batched_tokens={limits['max_num_batched_tokens']}, a pool of {limits['num_blocks']} "
            f"blocks of {BLOCK_SIZE} tokens")


def _state(scheduler: Scheduler, batch: ScheduledBatch) -> dict:
    return {"batch": [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)],
            "running": [s.request_id for s in scheduler.running],
            "waiting": [s.request_id for s in scheduler.waiting]}


def _explain(expected: dict, got: dict, scheduler: Scheduler, batch: ScheduledBatch) -> str:
    if batch.num_batched_tokens > scheduler.max_num_batched_tokens:
        hint = ("the batch holds more tokens than max_num_batched_tokens: a prompt gets at most the budget "
                "left (scheduler.num_new_tokens(seq, budget) says how much), and whatever a request takes is "
                "no longer left for the next one")
    elif len(scheduler.running) > scheduler.max_num_seqs:
        hint = "more than max_num_seqs sequences run: count the running ones before each admission"
    elif batch.preempted and got["running"] != expected["running"]:
        hint = ("this step preempted a sequence, and then admitted requests: admit none when batch.preempted "
                "is not empty (memory is short, and the victim would come straight back through its cached "
                "prefix)")
    elif [r for r in got["running"] if r not in expected["running"]]:
        hint = ("a request was admitted ahead of its turn: when the head of the queue does not fit "
                "(allocate returns False), stop; a later, smaller request must not pass it")
    else:
        hint = RULES
    return f"  expected: {expected}\n  got:      {got}\n  hint: {hint}"


def _simulate(admit: Callable, seed: int) -> None:
    limits, requests = _workload(seed)
    schedulers = [_scheduler(limits) for _ in range(2)]
    learner = schedulers[1]
    learner.admit = lambda batch, budget: call_learner(admit, "admit", f"step {step}, budget {budget}", learner,
                                                       batch, budget)
    queues = [[(t, Sequence(f"r{i}", prompt_token_ids=prompt, params=SamplingParams(max_tokens=m)))
               for i, (t, prompt, m) in enumerate(requests)] for _ in range(2)]
    described = _describe(seed, limits, requests)
    for step in range(1000):
        states = []
        for scheduler, queue in zip(schedulers, queues):
            while queue and queue[0][0] <= step:
                scheduler.add_request(queue.pop(0)[1])
            batch = scheduler.schedule()
            states.append((_state(scheduler, batch), batch))
        (expected, _), (got, batch) = states
        if expected != got:
            raise CheckFailed(f"admit: after scheduling step {step}, the scheduler differs from the reference "
                              f"({described})\n{_explain(expected, got, learner, batch)}")
        if not any(s.has_unfinished_requests() for s in schedulers) and not queues[0]:
            return
        for scheduler, (_, batch) in zip(schedulers, states):
            scheduler.update(batch, _produced(batch))
    raise CheckFailed(f"admit: the workload did not finish in 1000 steps ({described})")


def _produced(batch: ScheduledBatch) -> ModelRunnerOutput:
    """What a model would have produced: a token where one is due."""
    return ModelRunnerOutput([[len(seq.token_ids) % 7] if sample else []
                              for seq, sample in zip(batch.seqs, batch.do_sample)])


def check_admit(admit: Callable) -> None:
    """The learner's admission step against the reference on random workloads, step by step."""
    for seed in SEEDS:
        _simulate(admit, seed)
    print(f"check_admit passed: {len(SEEDS)} random workloads (arrivals over time, chunked prompts, preemption), "
          "every step the same batch and queues as the reference")


def _check_in_engine(fn: Callable, llm: LLM, name: str, rules: str) -> str:
    """Greedy generation with fn as the engine's admission step, limits checked after every call;
    the pool must be whole again at the end. Returns what was compared."""
    engine = llm.llm_engine
    scheduler = engine.scheduler

    def within_limits(batch: ScheduledBatch, budget: int) -> None:
        fn(scheduler, batch, budget)
        if batch.num_batched_tokens > scheduler.max_num_batched_tokens:
            raise CheckFailed(f"with your {name} in the engine, a step computes {batch.num_batched_tokens} tokens, "
                              f"more than max_num_batched_tokens={scheduler.max_num_batched_tokens}\n  hint: {rules}")
        if len(scheduler.running) > scheduler.max_num_seqs:
            raise CheckFailed(f"with your {name} in the engine, {len(scheduler.running)} sequences run, more than "
                              f"max_num_seqs={scheduler.max_num_seqs}\n  hint: {rules}")

    done = check_generation(llm, scheduler, "admit", scheduler.admit, within_limits, name)
    blocks = engine.block_manager
    if blocks is not None and blocks.num_free_blocks != blocks.num_blocks:
        raise CheckFailed(f"after generating with your {name}, {blocks.num_blocks - blocks.num_free_blocks} KV "
                          "blocks are still held: every admitted sequence must be in scheduler.running, where "
                          "the engine finishes it and frees its blocks")
    return done


def check_engine(admit: Callable, llm: LLM) -> None:
    """Greedy generation with the learner's admission step scheduling the engine. Any schedule that
    keeps the rules gives the same tokens, so the limits are checked after every call too, and the
    pool must be whole again at the end."""
    done = _check_in_engine(admit, llm, "admit", RULES)
    print(f"check_engine passed: with your admit scheduling every step, {done}, within the limits")


# ---- the learner's own policy: shortest prompt first, with aging ----

POLICY_RULES = ("choose among the waiting requests, never among the running ones; keep every rule of admit "
                "(budget, max_num_seqs, no admission in a step that preempted, memory before anything else, and "
                "when the request you chose gets no memory, stop); among requests that arrived together the "
                "shortest prompt goes first, and a request that has waited long enough (scheduler.steps_waited) "
                "goes before newer ones")


def _queue(lengths: list[int], waited: list[int], max_num_seqs: int) -> Scheduler:
    """A scheduler with nothing running and requests r0, r1, ... waiting, of the given prompt lengths,
    each having waited the given number of steps."""
    scheduler = _scheduler({"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 64, "num_blocks": 64})
    for i in sorted(range(len(lengths)), key=lambda i: -waited[i]):  # arrival order: the oldest first
        scheduler.num_steps = max(waited) - waited[i]
        scheduler.add_request(Sequence(f"r{i}", prompt_token_ids=[i % 7] * lengths[i],
                                       params=SamplingParams(max_tokens=4)))
    scheduler.num_steps = max(waited)
    return scheduler


def _order_case(policy: Callable, title: str, lengths: list[int], waited: list[int], max_num_seqs: int,
                expected: list[str], mistakes: dict[tuple[str, ...], str]) -> None:
    scheduler = _queue(lengths, waited, max_num_seqs)
    case = ", ".join(f"r{i}: {n} tokens, waited {w} steps" for i, (n, w) in enumerate(zip(lengths, waited)))
    room = f"room for {max_num_seqs} sequence{'s' if max_num_seqs > 1 else ''}"
    batch = ScheduledBatch([], [], [], [])
    where = f"on the queue '{title}' ({case}), with {room}"
    before = (list(scheduler.running), list(scheduler.waiting), 0)
    _call_policy(policy, scheduler, batch, 64, where)
    _check_step(scheduler, batch, before, where)
    got = [s.request_id for s in batch.seqs]
    if got != expected:
        hint = mistakes.get(tuple(got), POLICY_RULES)
        raise CheckFailed(f"{POLICY} {where}: "
                          f"admitted {got}, expected {expected}\n  hint: {hint}")


def _call_policy(policy: Callable, scheduler: Scheduler, batch: ScheduledBatch, budget: int, case: str) -> None:
    try:
        call_learner(policy, POLICY, case, scheduler, batch, budget)
    except CheckFailed as e:
        if "mutated during iteration" not in str(e):
            raise
        raise CheckFailed(f"{e}\n  hint: you removed a request from scheduler.waiting while a for loop was walking "
                          "through it; walk through a copy (sorted() returns a new list) or choose one request per "
                          "round of a while loop") from None


def _check_step(scheduler: Scheduler, batch: ScheduledBatch, before: tuple[list, list, int], where: str) -> None:
    """The rules one admission step keeps, whichever requests it chose."""
    running, waiting, in_batch = before
    joined = scheduler.running[len(running):]
    problem = None
    if scheduler.running[:len(running)] != running:
        problem = ("scheduler.running changed order or lost a sequence: a policy chooses among the *waiting* "
                   "requests; the running ones keep their admission order (the scheduler preempts the newest, "
                   "running[-1], and serves decodes oldest first)")
    elif any(all(s is not w for w in waiting) for s in joined):
        problem = "a sequence that was not waiting was appended to scheduler.running"
    elif list(scheduler.waiting) != [w for w in waiting if all(w is not s for s in joined)]:
        problem = ("scheduler.waiting is not the queue it was, less the admitted requests: take out the ones you "
                   "admit and leave the others in their order (arrival order, a preempted sequence at the front)")
    elif batch.seqs[in_batch:] != joined:
        problem = "every admitted request goes into the batch (batch.add), in the order it was admitted"
    elif any(s.status is not SequenceStatus.RUNNING for s in joined):
        problem = "a request was admitted without KV memory: scheduler.allocate(seq) first, and only if it is True"
    elif batch.num_batched_tokens > scheduler.max_num_batched_tokens:
        problem = (f"the batch holds {batch.num_batched_tokens} tokens, more than max_num_batched_tokens="
                   f"{scheduler.max_num_batched_tokens}: a request computes at most what the budget has left "
                   "(scheduler.num_new_tokens), and what it takes is gone for the next")
    elif len(scheduler.running) > scheduler.max_num_seqs:
        problem = f"{len(scheduler.running)} sequences run, more than max_num_seqs={scheduler.max_num_seqs}"
    elif batch.preempted and joined:
        problem = "requests were admitted in a step that preempted a sequence: memory is short, admit none"
    if problem:
        raise CheckFailed(f"{POLICY}, {where}: {problem}\n  the rules: {POLICY_RULES}")


def _simulate_policy(policy: Callable, seed: int) -> None:
    limits, requests = _workload(seed)
    scheduler = _scheduler(limits)
    described = _describe(seed, limits, requests)

    def guarded(batch: ScheduledBatch, budget: int) -> None:
        before = (list(scheduler.running), list(scheduler.waiting), len(batch.seqs))
        where = f"at step {step} ({described})"
        _call_policy(policy, scheduler, batch, budget, where)
        _check_step(scheduler, batch, before, where)

    scheduler.admit = guarded
    queue = [(t, Sequence(f"r{i}", prompt_token_ids=prompt, params=SamplingParams(max_tokens=m)))
             for i, (t, prompt, m) in enumerate(requests)]
    for step in range(1000):
        while queue and queue[0][0] <= step:
            scheduler.add_request(queue.pop(0)[1])
        if not queue and not scheduler.has_unfinished_requests():
            blocks = scheduler.kv_cache_manager.block_manager
            if blocks.num_free_blocks != blocks.num_blocks:
                raise CheckFailed(f"{POLICY}: {blocks.num_blocks - blocks.num_free_blocks} KV blocks are still "
                                  f"held after every request finished ({described})")
            return
        batch = scheduler.schedule()
        scheduler.update(batch, _produced(batch))
    raise CheckFailed(f"{POLICY}: the workload did not finish in 1000 steps ({described}): "
                      f"{len(scheduler.waiting)} requests are still waiting; does your policy admit anyone when "
                      "it could?")


def check_policy(policy: Callable) -> None:
    """Who goes first in hand-made queues, then the rules of every admission step on random workloads."""
    fifo_or_reversed = {("r0", "r1"): "you admitted in arrival order: choose the request with the shortest prompt "
                                      "among all the waiting ones, not the head of the queue",
                        ("r0", "r2"): "you admitted the longest prompts first: the shortest goes first "
                                      "(the smallest key, ascending order)"}
    _order_case(policy, "four fresh requests", [40, 6, 20, 12], [0, 0, 0, 0], 2, ["r1", "r3"], fifo_or_reversed)
    _order_case(policy, "an old long request among fresh short ones", [6, 40, 8], [0, 1000, 0], 1, ["r1"],
                {("r0",): "a request that has waited 1000 steps must not lose to fresh "
                          "short ones, or a long prompt starves while short ones keep coming: age the requests "
                          "with scheduler.steps_waited(seq)"})
    for seed in SEEDS:
        _simulate_policy(policy, seed)
    print(f"check_policy passed: shortest first among fresh requests, an old request first, and on {len(SEEDS)} "
          "random workloads every admission step kept the rules and every request finished")


def check_policy_engine(policy: Callable, llm: LLM) -> None:
    """Greedy generation with the learner's policy scheduling the engine: the same tokens as with the
    engine's own admission step (a policy changes when a request runs, never what it generates)."""
    done = _check_in_engine(policy, llm, POLICY, POLICY_RULES)
    print(f"check_policy_engine passed: with your {POLICY} scheduling every step, {done}, and no KV block was "
          "left held")


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


def _replay(llm: LLM, policy: Callable | None, requests: list[TimedRequest]):
    """The requests through llm's engine on the virtual clock, with policy as its admission step
    (None: the engine's own, first come, first served)."""
    scheduler = llm.llm_engine.scheduler
    if policy is not None:
        scheduler.admit = lambda batch, budget: _call_policy(policy, scheduler, batch, budget, "a call from the engine")
    try:
        return replay(llm.llm_engine, requests, COST)
    finally:
        vars(scheduler).pop("admit", None)


def check_policy_ttft(policy: Callable, llm: LLM) -> dict:
    """Your policy on the virtual clock: the long prompt in a stream of short ones is served in
    time, and on a mixed workload TTFT p50 beats first come, first served. Returns the mixed
    workload's rows and timings (for the table in the exercise)."""
    stream = stream_workload(llm)
    long = _replay(llm, policy, stream)[0]
    if long.ttft * 1e3 > LONG_WAIT_MS:
        raise CheckFailed(f"{POLICY} starves long prompts: a 160-token prompt arriving in a stream of short ones "
                          f"waited {long.ttft * 1e3:.0f} ms for its first token (at most {LONG_WAIT_MS} ms: first "
                          "come, first served takes about 80 ms, shortest first without aging about 620 ms, when the "
                          "stream ends)\n  hint: age faster: a step takes about 8 ms here, so how many steps may a "
                          "request wait before it goes ahead of fresh short prompts?")
    requests = mixed_workload(llm)
    rows, timings = {}, {}
    for name, fn in (("first come, first served", None), (POLICY, policy)):
        timings[name] = _replay(llm, fn, requests)
        rows[name] = summarize(timings[name], {})
    fcfs, mine = rows["first come, first served"], rows[POLICY]
    if mine["completed"] != mine["requests"]:
        raise CheckFailed(f"with {POLICY}, only {mine['completed']} of {mine['requests']} requests finished")
    if mine["ttft_p50_ms"] > TTFT_GAIN * fcfs["ttft_p50_ms"]:
        raise CheckFailed(f"with {POLICY}, TTFT p50 is {mine['ttft_p50_ms']:.0f} ms on the mixed workload, against "
                          f"{fcfs['ttft_p50_ms']:.0f} ms first come, first served: it should be at most "
                          f"{TTFT_GAIN:.0%} of it\n  hint: short prompts should pass long ones that have not "
                          "waited long; does your aging make everyone first come, first served after a few steps?")
    print(f"check_policy_ttft passed: the long prompt in a stream of short ones waited {long.ttft * 1e3:.0f} ms "
          f"(at most {LONG_WAIT_MS}); on the mixed workload TTFT p50 {mine['ttft_p50_ms']:.0f} ms against "
          f"{fcfs['ttft_p50_ms']:.0f} ms first come, first served")
    return {"rows": rows, "timings": timings, "requests": requests}
