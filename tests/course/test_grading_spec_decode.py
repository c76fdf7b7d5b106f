"""Exercise 05's checks: they pass the solution and minillm's own rules, name each usual mistake of the
two acceptance rules, and the engine check passes a right rejection sampler, fails a wrong one and
leaves the engine's own rules in place."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minillm import LLM
from minillm.grading.checks_greedy_accept import check_greedy_accept, greedy_cases
from minillm.grading.checks_rejection_sampler_engine import check_engine
from minillm.grading.checks_stochastic_accept import check_stochastic_accept, statistical_inputs, stochastic_cases
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read
from minillm.sample import rejection_sampler
from minillm.sample.rejection_sampler import PAD, RejectionSampler

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "05_speculative_decoding.ipynb"


@pytest.fixture(scope="module")
def solution() -> dict:
    namespace: dict = {}
    for cell in read(SOLUTION).cells:
        if cell.cell_type == "code" and (is_solution(cell) or cell.source.startswith("import")):
            exec(cell.source, namespace)
    return namespace


def test_checks_pass_the_solution_and_the_engines_rules(solution, capsys):
    for greedy, stochastic in ((solution["greedy_accept"], solution["stochastic_accept"]),
                               (rejection_sampler.greedy_accept, rejection_sampler.stochastic_accept)):
        check_greedy_accept(greedy)
        check_stochastic_accept(stochastic)
    out = capsys.readouterr().out
    assert out.count("check_greedy_accept passed") == 2 and out.count("check_stochastic_accept passed") == 2


def test_the_hand_made_cases_hold_what_the_engines_rules_give():
    for cases, rule in ((greedy_cases(), rejection_sampler.greedy_accept),
                        (stochastic_cases(), rejection_sampler.stochastic_accept)):
        for case in cases:
            assert rule(*case.args).tolist() == case.expected, case.title


# Greedy mistakes, written as what each changes in the right output.

def _greedy_parts(target, drafts, num):
    out = rejection_sampler.greedy_accept(target, drafts, num)
    kept = (out != PAD).sum(dim=1) - 1
    return out, kept, torch.arange(len(num))


def greedy_without_bonus(target, drafts, num):
    out, kept, rows = _greedy_parts(target, drafts, num)
    all_kept = kept == num
    out[rows[all_kept], num[all_kept]] = PAD
    return out


def greedy_bonus_off_by_one(target, drafts, num):
    out, kept, rows = _greedy_parts(target, drafts, num)
    all_kept = (kept == num) & (num > 0)
    out[rows[all_kept], num[all_kept]] = target[rows[all_kept], num[all_kept] - 1]
    return out


def greedy_keeps_the_draft_at_the_mismatch(target, drafts, num):
    out, kept, rows = _greedy_parts(target, drafts, num)
    mismatch = kept < num
    out[rows[mismatch], kept[mismatch]] = drafts[rows[mismatch], kept[mismatch]]
    return out


def greedy_goes_on_after_a_mismatch(target, drafts, num):
    """Every real position on its own: the draft where it matches, else the target's; then the bonus."""
    k = drafts.shape[1]
    real = torch.arange(k) < num[:, None]
    out = torch.full((len(num), k + 1), PAD)
    out[:, :k] = torch.where(real, torch.where(drafts == target[:, :k], drafts, target[:, :k]), PAD)
    out[torch.arange(len(num)), num] = target[torch.arange(len(num)), num]
    return out


def greedy_bonus_at_position_k(target, drafts, num):
    out, kept, rows = _greedy_parts(target, drafts, num)
    all_kept = kept == num
    out[rows[all_kept], num[all_kept]] = target[rows[all_kept], -1]
    return out


def greedy_token_zero_is_padding(target, drafts, num):
    """`drafts > 0` as the mask of real drafts: PAD is -1, and 0 is a token like any other."""
    return rejection_sampler.greedy_accept(target, drafts, (drafts > 0).long().cumprod(dim=1).sum(dim=1))


def greedy_stacks_positions(target, drafts, num):
    """Match flags built one position at a time: torch.stack of no tensors fails when k = 0."""
    torch.stack([drafts[:, j] == target[:, j] for j in range(drafts.shape[1])], dim=1)
    return rejection_sampler.greedy_accept(target, drafts, num)


def greedy_in_place(target, drafts, num):
    drafts.clamp_(min=0)
    return rejection_sampler.greedy_accept(target, drafts, num)


def not_implemented(*args):
    raise NotImplementedError()


@pytest.mark.parametrize("wrong, message", [
    (greedy_without_bonus, "bonus token is missing"),
    (greedy_bonus_off_by_one, "bonus is off by one"),
    (greedy_keeps_the_draft_at_the_mismatch, "emitted the draft's token"),
    (greedy_goes_on_after_a_mismatch, "tokens after the first rejection"),
    (greedy_bonus_at_position_k, r"row 0: 2 real drafts, both kept: the bonus is target_token_ids\[0, 2\]"),
    (greedy_token_zero_is_padding, r"random rows \(k = 4\) are wrong"),
    (greedy_stacks_positions, r"raised RuntimeError.*(?s:.*)on input: k = 0"),
    (lambda *args: rejection_sampler.greedy_accept(*args).int(), "dtype torch.int32; expected torch.long"),
    (lambda *args: rejection_sampler.greedy_accept(*args)[:, :-1], r"shape \[1, 3\]; expected .*k \+ 1"),
    (greedy_in_place, "changed its input draft_token_ids in place"),
    (not_implemented, "greedy_accept is not implemented yet"),
], ids=["no-bonus", "bonus-off-by-one", "draft-at-mismatch", "goes-on-after-mismatch", "bonus-at-k",
        "zero-as-padding", "crashes-at-k0", "int32", "no-room-for-bonus", "in-place", "not-implemented"])
def test_greedy_mistakes_are_named(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_greedy_accept(wrong)


def stochastic_with(accept=lambda u, p_x, q_x: u * q_x < p_x, stop_at_rejection=True, residual=True, bonus=True,
                    bonus_offset=0, bonus_minus_q=False, draw=lambda w, noise: (w / noise).argmax(dim=1),
                    ignore_num=False, bonus_at_k=False, residual_without_draft=False, clamp=True):
    """The rules written out, with one of them broken by a flag."""
    def stochastic_accept(target_probs, draft_probs, draft_token_ids, num_draft_tokens, uniforms, noise):
        batch, k = draft_token_ids.shape
        rows = torch.arange(batch)
        num = torch.full_like(num_draft_tokens, k) if ignore_num else num_draft_tokens
        real = torch.arange(k) < num[:, None]
        x = (draft_token_ids.clamp(min=0) if clamp else draft_token_ids)[..., None]
        accepted = accept(uniforms, target_probs[:, :k].gather(2, x)[..., 0], draft_probs.gather(2, x)[..., 0]) & real
        kept = accepted.long().cumprod(dim=1).bool()
        stop = kept.sum(dim=1)
        q = torch.cat([draft_probs, torch.zeros_like(target_probs[:, :1])], dim=1)
        rejected = stop < (k if residual_without_draft else num)
        p_stop = target_probs[rows, stop]
        after_rejection = (p_stop - q[rows, stop]).clamp(min=0) if residual else p_stop
        bonus_p = target_probs[rows, torch.full_like(stop, k) if bonus_at_k else (stop + bonus_offset).clamp(min=0)]
        if bonus_minus_q:
            bonus_p = (bonus_p - q[rows, (stop - 1).clamp(min=0)]).clamp(min=0)
        last = draw(torch.where(rejected[:, None], after_rejection, bonus_p), noise)
        out = torch.full((batch, k + 1), PAD)
        if not stop_at_rejection:  # each real position on its own: the draft, or its residual's token
            residuals = (target_probs[:, :k] - draft_probs).clamp(min=0)
            replacements = (residuals / noise[:, None]).argmax(dim=2)
            out[:, :k] = torch.where(real, torch.where(accepted, draft_token_ids, replacements), PAD)
            out[rows, num] = draw(target_probs[rows, num], noise)
            return out
        out[:, :k] = torch.where(kept, draft_token_ids, PAD)
        out[rows, stop] = torch.where(rejected | bonus, last, PAD)
        return out
    return stochastic_accept


@pytest.mark.parametrize("wrong, message", [
    (stochastic_with(bonus=False), "bonus token is missing"),
    (stochastic_with(bonus_offset=-1), "bonus is off by one"),
    (stochastic_with(bonus_minus_q=True), "no q to subtract"),
    (stochastic_with(stop_at_rejection=False), "tokens after the first rejection"),
    (stochastic_with(residual=False), "draw from the residual"),
    (stochastic_with(accept=lambda u, p_x, q_x: u <= p_x / q_x), "the test is strict"),
    (stochastic_with(accept=lambda u, p_x, q_x: u < torch.where(q_x > 0, p_x / q_x, 0)), r"q\(x\) = 0 and p\(x\) > 0"),
    (stochastic_with(accept=lambda u, p_x, q_x: u < p_x), r"min\(1, p\(x\) / q\(x\)\)"),
    (stochastic_with(accept=lambda u, p_x, q_x: u < q_x / p_x), r"min\(1, p\(x\) / q\(x\)\)"),
    (stochastic_with(draw=lambda w, noise: w.argmax(dim=1)), "the residual's most likely token"),
    (stochastic_with(draw=lambda w, noise: (w * noise).argmax(dim=1)), "the residual's most likely token"),
    (stochastic_with(draw=lambda w, noise: torch.multinomial(w, 1)[:, 0]), "random numbers of its own"),
    (stochastic_with(accept=lambda u, p_x, q_x: torch.rand_like(u) * q_x < p_x), "random numbers of its own"),
    (stochastic_with(ignore_num=True), r"row 1: 1 real draft(?s:.*)row 2: no drafts"),
    (stochastic_with(bonus_at_k=True), r"row 1: 1 real draft, kept: the bonus comes from target_probs\[1, 1\]"),
    (stochastic_with(residual_without_draft=True), r"row 2: no drafts .*subtract q only after a real draft"),
    (stochastic_with(clamp=False), r"raised RuntimeError(?s:.*)PAD = -1 after them, which is no token id: clamp"),
    # Passes every hand-made case; only the distribution shows it.
    (stochastic_with(accept=lambda u, p_x, q_x: u < p_x / (q_x + 0.05)), "not distributed as the target's p"),
    (not_implemented, "stochastic_accept is not implemented yet"),
], ids=["no-bonus", "bonus-off-by-one", "bonus-minus-q", "goes-on-after-rejection", "resamples-from-p",
        "u-at-most-ratio", "q-zero-rejects", "ignores-q", "inverted-ratio", "argmax-no-noise", "times-noise",
        "multinomial", "own-uniforms", "ignores-num", "bonus-at-k", "residual-without-draft", "no-clamp",
        "smoothed-q", "not-implemented"])
def test_stochastic_mistakes_are_named(wrong, message):
    torch.manual_seed(0)  # the variants that draw their own random numbers
    with pytest.raises(CheckFailed, match=message):
        check_stochastic_accept(wrong)


def test_every_position_of_the_statistical_test_is_reached_often():
    args, _ = statistical_inputs()
    out = rejection_sampler.stochastic_accept(*args)
    reached = (out != PAD).sum(dim=0)
    assert reached.min() > 1000, reached


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", dtype="float32", max_model_len=128,
               speculative_config={"model": "tiny-draft", "num_speculative_tokens": 4})


@pytest.mark.slow
def test_engine_check_passes_the_solution_fails_wrong_rules_and_restores_the_sampler(solution, llm, capsys):
    sampler = llm.llm_engine.model_runner.rejection_sampler
    check_engine(solution["greedy_accept"], solution["stochastic_accept"], llm)
    assert "check_engine passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="greedy generation differs from the reference(?s:.*)hint: the reference is"):
        check_engine(greedy_keeps_the_draft_at_the_mismatch, solution["stochastic_accept"], llm)
    # Drawing from p after a rejection is the subtlest wrong rule: the others move the distribution more.
    with pytest.raises(CheckFailed, match="sampled tokens are not distributed as the target's"):
        check_engine(solution["greedy_accept"], stochastic_with(residual=False), llm)
    with pytest.raises(CheckFailed, match="stochastic_accept returned dtype torch.int32"):
        check_engine(solution["greedy_accept"], lambda *a: solution["stochastic_accept"](*a).int(), llm)
    assert sampler.greedy_accept is RejectionSampler.greedy_accept is rejection_sampler.greedy_accept
    assert sampler.stochastic_accept is RejectionSampler.stochastic_accept is rejection_sampler.stochastic_accept
    assert not llm.llm_engine.has_unfinished_requests()


def test_engine_check_refuses_an_engine_without_speculation():
    with pytest.raises(CheckFailed, match="does not speculate"):
        check_engine(rejection_sampler.greedy_accept, rejection_sampler.stochastic_accept,
                     LLM("tiny", dtype="float32", max_model_len=64))
