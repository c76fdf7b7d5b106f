"""The chapters' timing-decided sentences and chapter 05's choice of k, driven by synthetic timings:
clean ones must give the right conclusion, deliberately noisy ones (a busy machine's bursts) the
"too noisy" note, never the wrong conclusion or an extreme k."""

from __future__ import annotations

import random

import pytest

from minillm.bench.verdict import NOISY_NOTE, estimate
from minillm.course import conclusions


def steady(value: float, n: int = 7, jitter: float = 0.02, seed: int = 0) -> list[float]:
    """Runs on a quiet machine: within a few percent of `value`."""
    rng = random.Random(seed)
    return [value * (1 + rng.uniform(-jitter, jitter)) for _ in range(n)]


def busy(value: float, n: int = 7, seed: int = 0) -> list[float]:
    """Runs on a busy machine: about half of them slowed 1.5 to 5 times by other work."""
    rng = random.Random(seed)
    return [value * (rng.uniform(1.5, 5) if rng.random() < 0.5 else 1) for _ in range(n)]


# Chapter 00: time per token of the naive loop, at 512 tokens of context over 32.

def test_chapter_00_concludes_growth_from_clean_timings():
    sentence = conclusions.context_cost(steady(4.0), 32, 512)
    assert "each new token costs more than the last" in sentence and NOISY_NOTE not in sentence


def test_chapter_00_concludes_flat_cost_when_the_machine_hides_the_work():
    sentence = conclusions.context_cost(steady(1.05), 32, 512)
    assert "less than 1.25x" in sentence and "costs more than the last" not in sentence


def test_chapter_00_noisy_example_from_the_issue():
    # What a busy machine printed (as ratios of 512 over 32 tokens), with steadier rounds around it.
    assert conclusions.context_cost([3.4, 0.9, 1.3, 4.0, 1.1], 32, 512).endswith(NOISY_NOTE)


# Chapter 01: a decode step of 2 sequences against a step of 1.

@pytest.mark.parametrize(("ratio", "expected"), [(2.5, "much more, because"), (1.1, "shares the first one's")])
def test_chapter_01_second_row_from_clean_step_times(ratio, expected):
    sentence = conclusions.second_row_cost(steady(3.0 * ratio, 8), steady(3.0, 8))
    assert expected in sentence and NOISY_NOTE not in sentence


def test_chapter_01_second_row_too_noisy_on_a_busy_machine():
    # A burst during batch 2's eight steps made the old single comparison blame the matmul.
    assert conclusions.second_row_cost(busy(3.3, 8, seed=9), busy(3.0, 8, seed=10)).endswith(NOISY_NOTE)


# Chapter 04: a decode step of 8 sequences against a step of 1.

@pytest.mark.parametrize(("growth", "expected"), [
    (1.05, "close to the first machine"), (2.5, "in between"), (7.5, "close to the second machine")])
def test_chapter_04_places_the_machine_from_clean_step_times(growth, expected):
    sentence = conclusions.step_growth(steady(2e-3 * growth, 40), steady(2e-3, 40), 8)
    assert expected in sentence and NOISY_NOTE not in sentence


def test_chapter_04_step_growth_is_too_noisy_on_a_busy_machine():
    # The issue's busy run printed 10.4x and "in between": bursts hit the steps of 1 and of 8 unevenly.
    sentence = conclusions.step_growth(busy(6e-3, 40, seed=1), busy(2e-3, 40, seed=2), 8)
    assert sentence.endswith(f"{NOISY_NOTE}.")


def test_chapter_04_step_growth_needs_steps_of_both_sizes():
    assert conclusions.step_growth(steady(1e-3, 40), [1e-3, 1e-3], 8).startswith("too few decode-only steps")


def test_chapter_04_single_request_is_slower_in_a_crowd_from_clean_timings():
    sentence = conclusions.per_token_in_crowd(steady(5e-3, 100), steady(2e-3, 100))
    assert sentence.endswith("slower per token in the crowd")


def test_chapter_04_single_request_about_as_fast_where_steps_are_flat():
    assert "within 10%" in conclusions.per_token_in_crowd(steady(2.02e-3, 100), steady(2e-3, 100))


@pytest.mark.parametrize(("crowd", "alone"), [
    (steady(2.4e-3, 100), steady(12e-3, 100)),  # the issue's quiet run: 0.2x, which no crowd can give
    (busy(2.4e-3, 100, seed=3), busy(2e-3, 100, seed=4)),
])
def test_chapter_04_single_request_never_concludes_from_noise(crowd, alone):
    assert conclusions.per_token_in_crowd(crowd, alone).endswith(NOISY_NOTE)


# Chapter 05: time to first token, the speedup's trend with the batch, and k.

# Chapter 07: first tokens of chats sharing a system prompt, with the prefix cache and without.

@pytest.mark.parametrize(("ratio", "expected"), [(0.4, "sooner, by the system prompt's prefill"),
                                                  (0.98, "a small part of a first token's time")])
def test_chapter_07_prefix_cache_from_clean_timings(ratio, expected):
    sentence = conclusions.prefix_cache_ttft(steady(50 * ratio, 4), steady(50, 4, seed=1))
    assert expected in sentence and NOISY_NOTE not in sentence


def test_chapter_07_prefix_cache_too_noisy_on_a_busy_machine():
    # A burst slowed two of the cached chats: the old single comparison of medians said "not sooner".
    assert conclusions.prefix_cache_ttft([40, 95, 110, 42], [50, 52, 49, 51]).endswith(NOISY_NOTE)


def test_chapter_05_first_token_no_sooner_from_clean_timings():
    assert conclusions.first_token_ratio(steady(1.0, 6)).endswith("no sooner")


def test_chapter_05_first_token_too_noisy_on_a_busy_machine():
    ratios = [s / p for s, p in zip(busy(20e-3, 6, seed=5), busy(20e-3, 6, seed=6))]
    assert conclusions.first_token_ratio(ratios).endswith(NOISY_NOTE)


@pytest.mark.parametrize(("large", "expected"), [(0.5, "it fell"), (1.0, "did not fall by more than 10%")])
def test_chapter_05_speedup_trend_from_clean_timings(large, expected):
    assert conclusions.speedup_trend(steady(1.0, 3), steady(large, 3), 1, 64).endswith(expected)


def test_chapter_05_speedup_trend_too_noisy_on_a_busy_machine():
    speedups = [p / s for p, s in zip(busy(1.0, 3, seed=7), busy(1.0, 3, seed=8))]
    assert conclusions.speedup_trend(speedups, [0.8, 1.6, 0.5], 1, 64).endswith(NOISY_NOTE)


def predicted(target_steps, draft_steps, verify_steps: dict[int, list[float]], alpha: float) -> dict:
    """Chapter 05's cost model E / (c·k + v) for k = 1..15, on estimates of the timings."""
    t_decode = estimate(target_steps)
    c = estimate(draft_steps) / t_decode
    v = {n: estimate(s) / t_decode for n, s in verify_steps.items()}
    return {k: (1 - alpha ** (k + 1)) / (1 - alpha) / (c * k + v[min(n for n in v if n >= k + 1)])
            for k in range(1, 16)}


@pytest.mark.parametrize(("draft", "alpha", "expected"), [(0.5, 0.7, 1), (0.05, 0.8, 5)])
def test_chapter_05_choose_k_from_clean_timings(draft, alpha, expected):
    verify = {n: steady(10e-3 * (1 + 0.01 * n), seed=n) for n in (2, 4, 8, 16)}
    k, why = conclusions.choose_k(predicted(steady(10e-3, 40), steady(10e-3 * draft, 40), verify, alpha), default=4)
    assert k == expected and why.startswith(f"k = {expected}, predicted") and NOISY_NOTE not in why


def test_chapter_05_choose_k_falls_back_to_the_default_not_an_extreme():
    # The issue's busy run picked k = 15: a draft timed mostly between bursts looks nearly free.
    verify = {n: steady(10e-3 * (1 + 0.01 * n), seed=n) for n in (2, 4, 8, 16)}
    draft = [0.3e-3] * 4 + [3e-3] * 3
    model = predicted(steady(10e-3, 40), draft, verify, 0.95)
    assert max(model, key=lambda k: model[k].median) == 15  # what ranking the medians alone picks
    assert conclusions.choose_k(model, default=4) == (
        4, f"k = 4, the default, because the cost model's timings are {NOISY_NOTE}")


@pytest.mark.parametrize("seed", range(5))
def test_chapter_05_choose_k_falls_back_to_the_default_on_a_busy_machine(seed):
    verify = {n: busy(10e-3 * (1 + 0.01 * n), seed=seed + n) for n in (2, 4, 8, 16)}
    model = predicted(busy(10e-3, 40, seed=seed), busy(5e-3, 40, seed=seed + 50), verify, 0.7)
    assert conclusions.choose_k(model, default=4)[0] == 4


def test_choose_k_refuses_a_default_it_was_not_given():
    with pytest.raises(ValueError, match="default"):
        conclusions.choose_k({1: estimate([1.0, 1.1, 1.2])}, default=4)
    with pytest.raises(ValueError, match="predicted"):
        conclusions.choose_k({}, default=4)


# Chapter 08: a batch-1 decode step against its bandwidth floor.

@pytest.mark.parametrize(("step", "expected"), [
    (1.2, "within reach of it"), (2.0, "a good part of it"), (10.0, "far below it, 9.00 of the 10.00 ms")])
def test_chapter_08_share_of_roof_from_clean_step_times(step, expected):
    sentence = conclusions.share_of_roof(1.0, [step * 0.99, step, step * 1.01])
    assert expected in sentence and NOISY_NOTE not in sentence


def test_chapter_08_share_of_roof_too_noisy_on_a_busy_machine():
    # Three steps on a CPU (the chapter's sweep), one of them in a burst: 29% to 57% of the roof.
    assert conclusions.share_of_roof(1.0, [1.5, 2.0, 5.0]).endswith(NOISY_NOTE)


# Chapter 08: async scheduling against the synchronous engine, ms per generated token.

def test_chapter_08_async_scheduling_gain_from_clean_runs():
    assert "faster, because the host's work" in conclusions.overlap_gain(steady(2.0), steady(1.4), on_gpu=True)
    assert "slower" in conclusions.overlap_gain(steady(1.0), steady(1.3), on_gpu=True)
    same = conclusions.overlap_gain(steady(1.0), steady(1.01), on_gpu=False)
    assert "the same within 10%" in same and "on a CPU the host is the device" in same


def test_chapter_08_async_scheduling_too_noisy_on_a_busy_machine():
    sentence = conclusions.overlap_gain(busy(1.0, seed=1), busy(1.0, seed=2), on_gpu=True)
    assert NOISY_NOTE in sentence and "faster" not in sentence and "slower" not in sentence


# Chapter 03: the ragged prefill kernel at 5 pipeline stages against 2.

def test_chapter_03_deeper_pipeline_from_clean_timings():
    assert "faster, so on this GPU" in conclusions.deeper_pipeline(steady(0.150), steady(0.120))
    assert "slower: the extra buffers" in conclusions.deeper_pipeline(steady(0.150), steady(0.190))
    assert "the same within 10%" in conclusions.deeper_pipeline(steady(0.150), steady(0.152))


def test_chapter_03_deeper_pipeline_too_noisy_on_a_busy_machine():
    sentence = conclusions.deeper_pipeline(busy(0.150, seed=3), busy(0.150, seed=4))
    assert NOISY_NOTE in sentence and "faster" not in sentence and "slower" not in sentence
