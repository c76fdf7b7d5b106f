"""The sentences chapters print from their timings, each decided from repeated runs with a stated
margin (minillm/bench/verdict.py), or the note that the machine was too busy to decide.

Each function takes the runs' timings (or an estimate made from them) and returns the sentence, so
that a test can hand it clean and deliberately noisy timings and read what a chapter would print.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from minillm.bench.verdict import MIN_SAMPLES, NOISY_NOTE, Estimate, Verdict, estimate, verdict

MATRIX_VECTOR = 1.5  # chapter 01: a step of 2 costing 50% more than a step of 1 is more than a second row's work
CONTEXT_GROWTH = 1.25  # chapter 00: a token at the longest context costs 25% more than at the shortest
STEP_FLAT = 1.3  # chapter 04: a step of 8 within 30% of a step of 1 is flat in its batch
STEP_PROPORTIONAL = 0.75  # chapter 04: ... and past 75% of the batch size it costs about in proportion
SAME_WITHIN = 1.1  # a 10% margin either way for "slower", "sooner" and "the same"
SPEEDUP_FELL = 0.9  # chapter 05: the speedup fell when batch 64's is below 90% of batch 1's
ROOF_NEAR, ROOF_FAR = 0.7, 0.3  # chapter 08: a step within reach of the bandwidth roof, and far below it


def context_cost(ratios: Sequence[float], short: int, long: int) -> str:
    """Chapter 00: time per generated token at context `long` over `short`, one ratio per round of
    the naive loop (the contexts timed in turn within each round)."""
    growth = estimate(ratios)
    said = f"from {short} to {long} tokens of context, a generated token cost {growth.factor()} as much"
    match verdict(growth, CONTEXT_GROWTH):
        case Verdict.ABOVE:
            return f"{said}: each new token costs more than the last, because the loop recomputes the whole history"
        case Verdict.BELOW:
            return (f"{said}: less than {CONTEXT_GROWTH:g}x, although the loop does {long // short}x the work; this "
                    "machine computes the longer sequence in parallel nearly as fast, so the waste does not show "
                    "in time yet, only in work")
    return f"{said}: {NOISY_NOTE}"


def second_row_cost(two_steps: Sequence[float], one_steps: Sequence[float]) -> str:
    """Chapter 01: a decode step of 2 sequences against a step of 1, from the times of each step.
    A second row shares the first's weight reads; a step of 2 that costs far more says the machine
    multiplies one row (a matrix-vector product) much faster than two."""
    ratio = estimate(two_steps) / estimate(one_steps)
    said = f"batch 2 costs {ratio.factor()} batch 1's step here"
    match verdict(ratio, MATRIX_VECTOR):
        case Verdict.ABOVE:
            return (f"{said}: much more, because on this machine a one-row matmul (a matrix-vector product) moves "
                    "bytes much faster than a product of two or more rows; time torch.nn.functional.linear alone "
                    "to see it")
        case Verdict.BELOW:
            return f"{said}: the second sequence shares the first one's weight reads"
    return f"{said}: {NOISY_NOTE}"


def step_growth(batch_steps: Sequence[float], single_steps: Sequence[float], batch: int) -> str:
    """Chapter 04: where a machine sits between a step whose time is flat in its batch and one whose
    time is in proportion to its tokens, from the seconds of decode-only steps of `batch` sequences
    and of one."""
    if min(len(batch_steps), len(single_steps)) < MIN_SAMPLES:
        return f"too few decode-only steps of {batch} and of 1 to compare ({len(batch_steps)}, {len(single_steps)})"
    growth = estimate(batch_steps) / estimate(single_steps)
    said = f"A step of {batch} costs {growth.factor()} a step of 1 here"
    flat, proportional = verdict(growth, STEP_FLAT), verdict(growth, STEP_PROPORTIONAL * batch)
    if flat is Verdict.BELOW:
        return f"{said}: close to the first machine, steps set the time and draining saves little over lockstep."
    if proportional is Verdict.ABOVE:
        return (f"{said}: close to the second machine, a step costs about in proportion to its tokens, so "
                "draining recovers most of lockstep's waste.")
    if flat is Verdict.ABOVE and proportional is Verdict.BELOW:
        return (f"{said}: in between, part of a step's time follows its tokens, so draining recovers part of "
                "lockstep's waste.")
    return f"{said}: {NOISY_NOTE}."


def per_token_in_crowd(crowd_steps: Sequence[float], alone_steps: Sequence[float]) -> str:
    """Chapter 04: one request's decode steps in a continuous batch against its steps alone (each of
    its decode steps gives it one token). A request cannot be faster in a crowd than alone, so a
    measurement that says so is noise."""
    ratio = estimate(crowd_steps) / estimate(alone_steps)
    said = f"its typical step in the crowd took {ratio.factor()} its step alone"
    if verdict(ratio, SAME_WITHIN) is Verdict.ABOVE:
        return f"{said}: slower per token in the crowd"
    if verdict(ratio, SAME_WITHIN) is Verdict.BELOW and verdict(ratio, 1 / SAME_WITHIN) is Verdict.ABOVE:
        return (f"{said}: within {SAME_WITHIN - 1:.0%}, as a step whose time is flat in its batch gives; "
                "only the steps that carried prompts cost it more")
    return f"{said}: {NOISY_NOTE}"


def first_token_ratio(ratios: Sequence[float]) -> str:
    """Chapter 05: time to first token with speculation over without, one ratio per prompt. No step
    that produces a first token verifies a draft, so speculation cannot make it come sooner."""
    ratio = estimate(ratios)
    said = f"first token with speculation: {ratio.factor()} the time without"
    if verdict(ratio, 1 / SAME_WITHIN) is Verdict.ABOVE:
        return f"{said}: no sooner"
    return f"{said}: {NOISY_NOTE}"


def _speed_compared(gain: Estimate, said: str, faster: str, slower: str, same: str) -> str:
    """`said`, then `faster` where the whole band of `gain` (one speed over another) lies above
    SAME_WITHIN, `slower` where it lies below its inverse, `same` where it lies between, and the
    noisy note where it straddles either."""
    match verdict(gain, SAME_WITHIN), verdict(gain, 1 / SAME_WITHIN):
        case Verdict.ABOVE, _:
            return f"{said}: {faster}"
        case _, Verdict.BELOW:
            return f"{said}: {slower}"
        case Verdict.BELOW, Verdict.ABOVE:
            return f"{said}: {same}"
    return f"{said}: {NOISY_NOTE}"


def deeper_pipeline(two_stage_ms: Sequence[float], five_stage_ms: Sequence[float]) -> str:
    """Chapter 03: the ragged prefill kernel at 5 pipeline stages against the launcher's 2, from the
    milliseconds of each, timed in turn. Five keep a second tile of K and V in flight, in buffers of
    shared memory that may leave room for fewer programs per multiprocessor."""
    gain = estimate(two_stage_ms) / estimate(five_stage_ms)
    return _speed_compared(
        gain, f"at 5 stages the kernel ran at {gain.factor()} its speed at 2",
        "faster, so on this GPU the copies' latency, not the programs sharing a multiprocessor, was what held "
        "the loop back",
        "slower: the extra buffers and their bookkeeping (and, on a GPU with less shared memory than an "
        "H100, fewer programs per multiprocessor) cost more here than the deeper pipeline saves",
        f"the same within {SAME_WITHIN - 1:.0%}: the wait for the copies is not what bounds it here")


def prefix_cache_ttft(cached: Sequence[float], uncached: Sequence[float]) -> str:
    """Chapter 07: time to first token of chats that share a system prompt, served with the prefix
    cache and without, one time per chat. With the cache a chat prefills only its own question, so
    it cannot be slower; how much sooner depends on what the system prompt's prefill costs here."""
    ratio = estimate(cached) / estimate(uncached)
    said = f"with the prefix cache a later chat's first token took {ratio.factor()} the time without"
    if verdict(ratio, 1 / SAME_WITHIN) is Verdict.BELOW:
        return f"{said}: sooner, by the system prompt's prefill"
    if verdict(ratio, 1 / SAME_WITHIN) is Verdict.ABOVE and verdict(ratio, SAME_WITHIN) is Verdict.BELOW:
        return (f"{said}: within {SAME_WITHIN - 1:.0%}, so on this machine the system prompt's prefill is a small "
                "part of a first token's time")
    return f"{said}: {NOISY_NOTE}"


def speedup_trend(small_batch: Sequence[float], large_batch: Sequence[float], small: int, large: int) -> str:
    """Chapter 05: speculation's speedup at a large batch against a small one, a speedup per run."""
    ratio = estimate(large_batch) / estimate(small_batch)
    low, high = estimate(small_batch), estimate(large_batch)
    said = f"from batch {small} to batch {large} the speedup went from {low.median:.2f}x to {high.median:.2f}x"
    match verdict(ratio, SPEEDUP_FELL):
        case Verdict.BELOW:
            return f"{said}: it fell"
        case Verdict.ABOVE:
            return f"{said}: it did not fall by more than {1 - SPEEDUP_FELL:.0%}"
    return f"{said}: {NOISY_NOTE}"


def choose_k(predicted: Mapping[int, Estimate], default: int, max_spread: float = 0.5,
             tolerance: float = 0.05) -> tuple[int, str]:
    """Chapter 05: the number of draft tokens from the cost model's predicted speedup per k (each
    an estimate over the timings it rests on), and why. The smallest k within `tolerance` of the
    best: where the curve is flat, a larger k only adds risk. When any k's band is wider than
    `max_spread` of its median, the timings cannot rank the k's, and `default` is used."""
    if not predicted:
        raise ValueError("predicted: need the predicted speedup of at least one k")
    if default not in predicted:
        raise ValueError(f"default: {default} is not one of the k's predicted, {sorted(predicted)}")
    best = max(predicted, key=lambda k: predicted[k].median)
    if max(e.spread for e in predicted.values()) > max_spread:
        return default, f"k = {default}, the default, because the cost model's timings are {NOISY_NOTE}"
    chosen = min(k for k, e in predicted.items() if e.median >= (1 - tolerance) * predicted[best].median)
    return chosen, (f"k = {chosen}, predicted {predicted[chosen].median:.2f}x, the smallest k within "
                    f"{tolerance:.0%} of the best ({best}, {predicted[best].median:.2f}x)")


def share_of_roof(floor_ms: float, step_ms: Sequence[float]) -> str:
    """Chapter 08: how close a batch-1 decode step comes to its bandwidth floor (the time its bytes
    take at the copy bandwidth), from the milliseconds of each timed step."""
    step = estimate(step_ms)
    share = floor_ms / step
    said = f"{share.median:.0%} of the roof (middle half of the steps {share.low:.0%} to {share.high:.0%})"
    near, far = verdict(share, ROOF_NEAR), verdict(share, ROOF_FAR)
    if near is Verdict.ABOVE:
        return f"{said}: within reach of it, only fewer bytes per step (chapter 06's quantization) make batch 1 faster"
    if far is Verdict.BELOW:
        return (f"{said}: far below it, {step.median - floor_ms:.2f} of the {step.median:.2f} ms go to something "
                "other than moving weights (the host's work around the kernels, small operations, the sampler): the "
                "sections on launch overhead and utilisation below show where")
    if far is Verdict.ABOVE and near is Verdict.BELOW:
        return (f"{said}: a good part of it, not all: the rest of the step (small kernels, attention, sampling, the "
                "host's bookkeeping) costs as much as moving some of the weights again")
    return f"{said}: {NOISY_NOTE}"


def overlap_gain(sync_ms: Sequence[float], async_ms: Sequence[float], on_gpu: bool) -> str:
    """Chapter 08: async scheduling against the synchronous engine, from the milliseconds per generated
    token of runs of each, taken in turn."""
    gain = estimate(sync_ms) / estimate(async_ms)
    why_same = ("the host's work and the device's already overlap little here (compare `replay ms` with `step ms` "
                "in bench decode)" if on_gpu else
                "on a CPU the host is the device: there is nothing to overlap, and the engine does the same work")
    return _speed_compared(
        gain, f"async scheduling: {gain.factor()} the synchronous engine's speed",
        "faster, because the host's work between steps now runs while the device computes the next step, "
        "instead of while the device waits",
        "slower: the extra token computed for each sequence that stops, and the copies the device makes for "
        "each step's input, cost more here than the overlap saves",
        f"the same within {SAME_WITHIN - 1:.0%}: {why_same}")
