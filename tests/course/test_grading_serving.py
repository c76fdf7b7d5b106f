"""Exercise 07's checks: they pass the solution, name each usual mistake of the token budget, fail a
rule that does no better than first come, first served, and catch a budget that stalls the engine.
check_server runs on the solution where every solution does: under nbval and in test_grading_marks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from minillm import LLM
from minillm.engine.policy import max_token_budget
from minillm.grading import checks_serving as checks
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "07_serving.ipynb"


@pytest.fixture(scope="module")
def token_budget():
    namespace: dict = {}
    for cell in read(SOLUTION).cells:
        if cell.cell_type == "code" and (is_solution(cell) or cell.id == "imports"):
            exec(cell.source, namespace)
    return namespace["token_budget"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", **checks.ENGINE)


def decodes(scheduler) -> int:
    return sum(seq.num_tokens - seq.num_computed_tokens == 1 for seq in scheduler.running)


def always_capped(scheduler, cost, tpot_slo):
    return min(scheduler.max_num_batched_tokens, max(decodes(scheduler) + 1, cost.tokens_within(tpot_slo)))


def without_fixed_cost(scheduler, cost, tpot_slo):
    if not decodes(scheduler):
        return scheduler.max_num_batched_tokens
    return min(scheduler.max_num_batched_tokens, max(decodes(scheduler) + 1, int(tpot_slo / cost.per_token)))


def starving(scheduler, cost, tpot_slo):
    if not decodes(scheduler):
        return scheduler.max_num_batched_tokens
    return min(scheduler.max_num_batched_tokens, cost.tokens_within(tpot_slo))


def uncapped(scheduler, cost, tpot_slo):
    return cost.tokens_within(tpot_slo) if decodes(scheduler) else scheduler.max_num_batched_tokens


def counts_prompts_as_decodes(scheduler, cost, tpot_slo):
    if not scheduler.running:
        return scheduler.max_num_batched_tokens
    return min(scheduler.max_num_batched_tokens, max(len(scheduler.running) + 1, cost.tokens_within(tpot_slo)))


def counts_generated_tokens_as_decoding(scheduler, cost, tpot_slo):
    generating = sum(seq.num_output_tokens > 0 for seq in scheduler.running)
    if not generating:
        return scheduler.max_num_batched_tokens
    return min(scheduler.max_num_batched_tokens, max(generating + 1, cost.tokens_within(tpot_slo)))


def rounded_to_nearest(scheduler, cost, tpot_slo):
    if not decodes(scheduler):
        return scheduler.max_num_batched_tokens
    within = round((tpot_slo - cost.fixed) / cost.per_token)
    return min(scheduler.max_num_batched_tokens, max(decodes(scheduler) + 1, within))


def a_float(scheduler, cost, tpot_slo):
    if not decodes(scheduler):
        return scheduler.max_num_batched_tokens
    within = (tpot_slo - cost.fixed) / cost.per_token
    return min(scheduler.max_num_batched_tokens, max(decodes(scheduler) + 1.0, within))


def test_the_solution_passes_every_case(token_budget, capsys):
    checks.check_token_budget(token_budget)
    assert "check_token_budget passed: 10" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, words", [
    (always_capped, "no TPOT to protect"), (without_fixed_cost, "fixed part"), (starving, "wait forever"),
    (uncapped, "never more than"), (counts_prompts_as_decodes, "not a decode"), (a_float, "must return an int"),
    (rounded_to_nearest, "expected 73, got 74(?s:.*)not to the nearest"),
    (counts_generated_tokens_as_decoding, "recomputed after preemption"),
])
def test_each_usual_mistake_is_named(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        checks.check_token_budget(wrong)


def test_goodput_beats_first_come_first_served_and_a_stall_is_caught(token_budget, llm, capsys):
    rows = checks.check_goodput(token_budget, llm)
    assert rows["token_budget"]["slo_attained"] == 1 and rows["fcfs"]["slo_attained"] < 0.9
    # The rule went into an engine of its own as its scheduling policy; the baseline's kept the default.
    assert llm.llm_engine.scheduler.policy.token_budget is max_token_budget
    assert not vars(llm.llm_engine.scheduler).keys() & {"admit", "token_budget"}
    assert "check_goodput passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="clearly better"):
        checks.check_goodput(lambda s, cost, slo: s.max_num_batched_tokens, llm)
    with pytest.raises(CheckFailed, match="no progress"):
        checks.check_goodput(lambda s, cost, slo: 0 if s.waiting else 512, llm)
    assert not math.isnan(rows["fcfs"]["tpot_p95_ms"])

