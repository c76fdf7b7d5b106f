"""Estimates from repeated timings: median and quartile band, interval arithmetic, and a verdict that
is decided only when the whole band lies on one side of the threshold."""

from __future__ import annotations

import math

import pytest

from minillm.bench.verdict import Estimate, Verdict, estimate, verdict


def test_estimate_is_the_median_and_the_quartiles():
    e = estimate([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (e.median, e.low, e.high) == (3.0, 2.0, 4.0)
    assert e.spread == pytest.approx(2 / 3)


def test_one_slow_run_in_five_moves_nothing_two_widen_the_band():
    quiet = estimate([10.0, 10.1, 9.9, 10.1, 10.0])
    assert estimate([10.0, 60.0, 9.9, 10.1, 10.0]) == quiet
    busy = estimate([10.0, 60.0, 9.9, 10.1, 55.0])
    assert busy.median == 10.1 and busy.high == 55.0 and busy.spread > 4


def test_arithmetic_carries_the_band_as_an_interval():
    a, b = Estimate(2.0, 1.0, 4.0), Estimate(1.0, 0.5, 2.0)
    assert a / b == Estimate(2.0, 0.5, 8.0)
    assert 4 / a == Estimate(2.0, 1.0, 4.0)
    assert a * 3 == 3 * a == Estimate(6.0, 3.0, 12.0)
    assert a + b == Estimate(3.0, 1.5, 6.0)
    assert Estimate(2.5, 2.0, 3.0).factor() == "2.50x (middle half of the runs 2.00x to 3.00x)"


@pytest.mark.parametrize(("band", "expected"), [
    ((1.5, 1.4, 1.6), Verdict.ABOVE), ((1.0, 0.9, 1.1), Verdict.BELOW), ((1.3, 1.1, 1.6), Verdict.NOISY)])
def test_verdict_needs_the_whole_band_on_one_side(band, expected):
    assert verdict(Estimate(*band), 1.25) is expected


@pytest.mark.parametrize("samples", [[1.0, 2.0], [1.0, 2.0, math.nan], [1.0, 2.0, 0.0], [1.0, 2.0, -1.0]])
def test_estimate_refuses_too_few_or_meaningless_runs(samples):
    with pytest.raises(ValueError, match="samples"):
        estimate(samples)


@pytest.mark.parametrize("threshold", [0.0, -1.0, math.inf, math.nan])
def test_verdict_refuses_a_meaningless_threshold(threshold):
    with pytest.raises(ValueError, match="threshold"):
        verdict(Estimate(1.0, 0.9, 1.1), threshold)
