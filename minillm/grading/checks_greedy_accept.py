"""Checks for exercise 05, part 1: the learner's `greedy_accept`, the rejection sampler's greedy rule.

Hand-made cases come first: tiny vocabularies that force each decision, so the right output is known
exactly, and so are the outputs of the usual mistakes. Then random batches against the reference,
token for token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.grading.feedback import CheckFailed
from minillm.grading.rejection_sampler_cases import (
    CONTINUED,
    GREEDY_ARGS,
    GREEDY_RULE,
    MISSING_BONUS,
    Case,
    call_on_copies,
    describe,
    longs,
    run_case,
)
from minillm.sample import rejection_sampler
from minillm.sample.rejection_sampler import PAD


def greedy_cases() -> list[Case]:
    target = longs([[5, 2, 7, 1]])
    off_by_one = "the bonus is off by one: it is the target's token after the last draft, target_token_ids[b, 3] here"
    draft_kept = ("at the first mismatch you emitted the draft's token: emit the target's there (that is what "
                  "decoding without speculation would produce)")
    return [
        Case("every draft matches the target: all 3 are kept, then the bonus",
             (target, longs([[5, 2, 7]]), longs([3])), [[5, 2, 7, 1]],
             mistakes=(([[5, 2, 7, 7]], off_by_one),), too_few=MISSING_BONUS),
        Case("the second draft differs from the target: the target's token replaces it, and the run stops",
             (target, longs([[5, 3, 7]]), longs([3])), [[5, 2, PAD, PAD]],
             mistakes=(([[5, 3, PAD, PAD]], draft_kept),), too_many=CONTINUED,
             too_few="the target's token at the first mismatch is missing: a rejection still emits one token, "
                     "the target's, so that every step makes progress"),
        Case("the first draft already differs: only the target's first token is emitted",
             (target, longs([[9, 2, 7]]), longs([3])), [[5, PAD, PAD, PAD]],
             mistakes=(([[9, PAD, PAD, PAD]], draft_kept),), too_many=CONTINUED),
        Case("rows with fewer real drafts than k = 3 (after them, draft_token_ids holds PAD = -1 and "
             "target_token_ids padding)",
             (longs([[4, 4, 6, 8], [3, 9, 9, 9], [1, 2, 3, 4]]), longs([[4, 4, PAD], [PAD, PAD, PAD], [1, 2, 3]]),
              longs([2, 0, 3])),
             [[4, 4, 6, PAD], [3, PAD, PAD, PAD], [1, 2, 3, 4]],
             rows=("2 real drafts, both kept: the bonus is target_token_ids[0, 2]",
                   "no drafts (num_draft_tokens = 0): just the target's token at position 0",
                   "3 real drafts, all kept: the bonus is target_token_ids[2, 3]")),
        Case("k = 0: no drafts at all (draft_token_ids has shape [2, 0]); each row emits the target's token",
             (longs([[3], [6]]), torch.zeros(2, 0, dtype=torch.long), longs([0, 0])), [[3], [6]]),
    ]


def check_greedy_accept(greedy_accept: Callable) -> None:
    """Hand-made cases, then random batches against the reference."""
    cases = greedy_cases()
    for case in cases:
        run_case(greedy_accept, "greedy_accept", GREEDY_ARGS, case, GREEDY_RULE)
    rows = _random_greedy(greedy_accept)
    print(f"check_greedy_accept passed: {len(cases)} hand-made cases (mismatches, bonus, padding, k = 0), then "
          f"{rows} random rows token for token as the reference")


def _random_greedy(greedy_accept: Callable, batch: int = 256, k: int = 4, seed: int = 0) -> int:
    """Three token ids, so drafts often match; each row with 0..k real drafts."""
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 3, (batch, k + 1), generator=gen)
    num = torch.randint(0, k + 1, (batch,), generator=gen)
    drafts = torch.where(torch.arange(k) < num[:, None], torch.randint(0, 3, (batch, k), generator=gen), PAD)
    args = (target, drafts, num)
    got = call_on_copies(greedy_accept, "greedy_accept", GREEDY_ARGS, args, f"{batch} random rows, k = {k}")
    expected = rejection_sampler.greedy_accept(*args)
    wrong = (got != expected).any(dim=1).nonzero().flatten().tolist()
    if wrong:
        b = wrong[0]
        raise CheckFailed(f"greedy_accept: {len(wrong)} of {batch} random rows (k = {k}) are wrong; the first, "
                          f"row {b}:\n{describe(GREEDY_ARGS, [a[b:b + 1] for a in args])}\n  expected: "
                          f"{expected[b].tolist()}\n  got:      {got[b].tolist()}\n  hint: rows are independent: "
                          f"{GREEDY_RULE}")
    return batch
