"""Exercise 04's checks: they pass the solution, name common mistakes in the admission step and in
the learner's own policy (shortest prompt first, with aging), and the engine checks hand the
learner's function to the engine through its scheduling_policy argument."""

from __future__ import annotations

from pathlib import Path

import pytest

from minillm import LLM
from minillm.grading import checks_scheduler_engine
from minillm.grading.checks_scheduler_admit import check_admit
from minillm.grading.checks_scheduler_engine import check_engine, check_policy_engine
from minillm.grading.checks_scheduler_policy import check_policy
from minillm.grading.checks_scheduler_ttft import TTFT_GAIN, check_policy_ttft
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "04_continuous_batching.ipynb"


@pytest.fixture(scope="module")
def solution() -> dict:
    namespace: dict = {}
    for cell in read(SOLUTION).cells:
        if is_solution(cell) and cell.cell_type == "code":
            exec(cell.source, namespace)
    return namespace


@pytest.fixture(scope="module")
def admit(solution):
    return solution["admit"]


@pytest.fixture(scope="module")
def policy(solution):
    return solution["admit_shortest_first"]


def admit_with(take_tokens=None, limit_slots=True, stop_at_head=True, spend=True, after_preemption=False,
               limit_budget=True, allocate=True):
    """The solution's loop with one rule broken."""
    def admit(scheduler, batch, budget):
        for seq in list(scheduler.waiting):
            if (limit_budget and budget <= 0) or (limit_slots and len(scheduler.running) >= scheduler.max_num_seqs) or (
                    batch.preempted and not after_preemption):
                break
            if allocate and not scheduler.allocate(seq):
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
    check_admit(admit)
    check_admit(admit_with())
    assert capsys.readouterr().out.count("check_admit passed") == 2


@pytest.mark.parametrize("wrong, message", [
    (admit_with(take_tokens=lambda seq: seq.num_tokens - seq.num_computed_tokens), "more tokens than max_num_batched"),
    (admit_with(spend=False), "more tokens than max_num_batched"),
    (admit_with(limit_slots=False), "more than max_num_seqs"),
    (admit_with(limit_budget=False), "joined the batch with 0 tokens to compute(?s:.*)budget > 0"),
    (admit_with(stop_at_head=False), "admitted ahead of its turn"),
    (admit_with(after_preemption=True), "this step preempted a sequence, and then admitted"),
    (lambda scheduler, batch, budget: None, "expected: .*(?s:.*)allocate"),
    (admit_with(allocate=False), "expected: .*(?s:.*)needs KV memory first"),
], ids=["no-chunking", "budget-not-spent", "no-slot-limit", "no-budget-left", "overtakes-the-head",
        "admits-after-preemption", "admits-nothing", "no-memory"])
def test_checks_name_the_mistake(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_admit(wrong)


@pytest.mark.slow
def test_engine_check_passes_the_solution_and_fails_a_wrong_one_given_as_the_scheduling_policy(admit, capsys,
                                                                                                monkeypatch):
    engines = []

    def llm(*args, **engine_args) -> LLM:
        engines.append((built := LLM(*args, **engine_args)).llm_engine)
        return built

    monkeypatch.setattr(checks_scheduler_engine, "LLM", llm)
    check_engine(admit)
    assert "check_engine passed" in capsys.readouterr().out
    (engine,) = engines
    assert engine.scheduler.policy is engine.config.scheduler.scheduling_policy  # an engine argument,
    assert not vars(engine.scheduler).keys() & {"admit", "token_budget"}  # nothing swapped on its scheduler
    assert engine.block_manager.num_free_blocks == 5 and not engine.scheduler.has_unfinished_requests()
    with pytest.raises(CheckFailed, match="more than max_num_batched_tokens=16"):
        check_engine(admit_with(take_tokens=lambda seq: seq.num_tokens - seq.num_computed_tokens))


def policy_with(priority=lambda scheduler, seq: seq.num_tokens - 8 * scheduler.steps_waited(seq), spend=True,
                sort_running=False, after_preemption=False, limit_slots=True, pass_the_refused=False):
    """A shortest-first policy (smaller priority first) with one rule broken."""
    def admit_shortest_first(scheduler, batch, budget):
        refused = []
        while scheduler.waiting and budget > 0 and (after_preemption or not batch.preempted) and (
                len(scheduler.running) < scheduler.max_num_seqs or not limit_slots):
            candidates = [s for s in scheduler.waiting if s not in refused]
            if not candidates:
                break
            seq = min(candidates, key=lambda s: priority(scheduler, s))
            if not scheduler.allocate(seq):
                if pass_the_refused:
                    refused.append(seq)
                    continue
                break
            scheduler.waiting.remove(seq)
            scheduler.running.append(seq)
            n = scheduler.num_new_tokens(seq, budget) if spend else seq.num_tokens - seq.num_computed_tokens
            budget -= batch.add(seq, n)
        if sort_running:
            scheduler.running.sort(key=lambda s: s.num_tokens)
    return admit_shortest_first


def admit_in_turn(scheduler, batch, budget, seqs) -> None:
    """Admits seqs in the order given, within the rules, until one gets no memory."""
    for seq in seqs:
        if budget <= 0 or batch.preempted or len(scheduler.running) >= scheduler.max_num_seqs:
            break
        if not scheduler.allocate(seq):
            break
        scheduler.waiting.remove(seq)
        scheduler.running.append(seq)
        budget -= batch.add(seq, scheduler.num_new_tokens(seq, budget))


def mutates_the_queue_while_iterating(scheduler, batch, budget):
    admit_in_turn(scheduler, batch, budget, scheduler.waiting)


def skips_what_does_not_fit(scheduler, batch, budget):
    """Shortest first among the requests the cache has room for, asked before allocating."""
    fitting = [s for s in scheduler.waiting if scheduler.kv_cache_manager.can_allocate(s)]
    admit_in_turn(scheduler, batch, budget, sorted(fitting, key=lambda s: s.num_tokens - 8 * scheduler.steps_waited(s)))


def test_policy_check_passes_the_solution_and_the_rules_restated(policy, capsys):
    check_policy(policy)
    check_policy(policy_with())
    assert capsys.readouterr().out.count("check_policy passed") == 2


@pytest.mark.parametrize("wrong, message", [
    (policy_with(priority=lambda scheduler, seq: -seq.num_tokens), "longest prompts first"),
    (policy_with(priority=lambda scheduler, seq: 0), "arrival order"),
    (policy_with(priority=lambda scheduler, seq: seq.num_tokens), "waited 1000 steps must not lose"),
    (policy_with(sort_running=True), "scheduler.running changed order"),
    (mutates_the_queue_while_iterating, "deque mutated during iteration(?s:.*)walk through a copy"),
    (policy_with(spend=False), "more than max_num_batched_tokens"),
    (policy_with(after_preemption=True), "admitted in a step that preempted"),
    (policy_with(limit_slots=False), "more than max_num_seqs"),
    (policy_with(pass_the_refused=True), r"no memory for r\d+, (?s:.*)when the request you chose gets no memory"),
    (skips_what_does_not_fit, r"no memory for r\d+, (?s:.*)when the request you chose gets no memory"),
], ids=["reversed-order", "first-come-first-served", "starves-long-prompts", "reorders-running",
        "mutates-the-queue-while-iterating", "beyond-the-budget", "admits-after-preemption",
        "no-slot-limit", "passes-the-request-refused-memory", "skips-what-does-not-fit"])
def test_policy_check_names_the_mistake(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_policy(wrong)


@pytest.mark.slow
def test_policy_engine_check_passes_the_solution_and_fails_a_wrong_one(policy, capsys):
    check_policy_engine(policy)
    assert "check_policy_engine passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="sequences run, more than max_num_seqs=2"):
        check_policy_engine(policy_with(limit_slots=False))


@pytest.mark.slow
def test_policy_ttft_check_passes_the_solution_on_the_virtual_clock(policy):
    measured = check_policy_ttft(policy)
    fcfs, mine = measured["rows"].values()
    assert mine["ttft_p50_ms"] <= TTFT_GAIN * fcfs["ttft_p50_ms"]
    assert mine["completed"] == mine["requests"] == len(measured["requests"])


@pytest.mark.slow
@pytest.mark.parametrize("rate, message", [(2, "starves long prompts"), (64, "TTFT p50 is")],
                         ids=["aging-too-slow", "aging-so-fast-it-is-first-come-first-served"])
def test_policy_ttft_check_names_an_aging_rate_out_of_balance(rate, message):
    aging = policy_with(priority=lambda scheduler, seq: seq.num_tokens - rate * scheduler.steps_waited(seq))
    with pytest.raises(CheckFailed, match=message):
        check_policy_ttft(aging)
