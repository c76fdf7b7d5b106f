"""Exercise 04's checks: they pass the solution, name common mistakes in the admission step, refuse
the untouched exercise, and the engine check leaves the scheduler's own admission step in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from minillm import LLM
from minillm.grading import checks_scheduler as checks
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read
from minillm.scheduler import Scheduler

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "04_continuous_batching.ipynb"


@pytest.fixture(scope="module")
def admit():
    namespace: dict = {}
    for cell in filter(is_solution, read(SOLUTION).cells):
        exec(cell.source, namespace)
    return namespace["admit"]


def admit_with(take_tokens=None, limit_slots=True, stop_at_head=True, spend=True, after_preemption=False):
    """The solution's loop with one rule broken."""
    def admit(scheduler, batch, budget):
        for seq in list(scheduler.waiting):
            if budget <= 0 or (limit_slots and len(scheduler.running) >= scheduler.max_num_seqs) or (
                    batch.preempted and not after_preemption):
                break
            if not scheduler.allocate(seq):
                if stop_at_head:
                    break
                continue
            scheduler.waiting.remove(seq)
            scheduler.running.append(seq)
            n = take_tokens(seq) if take_tokens else scheduler.num_new_tokens(seq, budget)
            batch.add(seq, n)
            budget -= n if spend else 0
    return admit


def test_checks_pass_on_the_solution_and_on_the_rules_restated(admit, capsys):
    checks.check_admit(admit)
    checks.check_admit(admit_with())
    assert capsys.readouterr().out.count("check_admit passed") == 2


@pytest.mark.parametrize("wrong, message", [
    (admit_with(take_tokens=lambda seq: seq.num_tokens - seq.num_computed_tokens), "more tokens than max_num_batched"),
    (admit_with(spend=False), "more tokens than max_num_batched"),
    (admit_with(limit_slots=False), "more than max_num_seqs"),
    (admit_with(stop_at_head=False), "admitted ahead of its turn"),
    (admit_with(after_preemption=True), "this step preempted a sequence, and then admitted"),
    (lambda scheduler, batch, budget: None, "expected: .*(?s:.*)allocate"),
], ids=["no-chunking", "budget-not-spent", "no-slot-limit", "overtakes-the-head", "admits-after-preemption",
        "admits-nothing"])
def test_checks_name_the_mistake(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_admit(wrong)


@pytest.mark.slow
def test_engine_check_passes_the_solution_fails_a_wrong_one_and_restores_the_scheduler(admit, capsys):
    llm = LLM("tiny", dtype="float32", max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16, num_kv_blocks=5)
    scheduler = llm.llm_engine.scheduler
    checks.check_engine(admit, llm)
    assert "check_engine passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="more than max_num_batched_tokens=16"):
        checks.check_engine(admit_with(take_tokens=lambda seq: seq.num_tokens - seq.num_computed_tokens), llm)
    assert scheduler.admit.__func__ is Scheduler.admit and not scheduler.has_unfinished_requests()
    assert llm.llm_engine.block_manager.num_free_blocks == 5
