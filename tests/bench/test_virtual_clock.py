"""The step cost model of the virtual clock, fitted to measured steps."""

from __future__ import annotations

import pytest

from minillm.bench.virtual_clock import StepCost, fit_step_cost


def test_the_fit_recovers_a_line_and_never_a_step_that_gets_cheaper_with_more_tokens():
    sizes = [1, 64, 256, 512]
    cost = fit_step_cost(sizes, [0.004 + 2e-5 * n for n in sizes])
    assert (cost.fixed, cost.per_token) == (pytest.approx(0.004), pytest.approx(2e-5))
    assert cost.tokens_within(0.005) == 50
    # Flat steps with noise that tilts the line down (a small model on a GPU): flat, at their mean.
    flat = fit_step_cost(sizes, [0.0052, 0.0051, 0.0050, 0.0049])
    assert flat == StepCost(fixed=pytest.approx(0.00505), per_token=0.0)
