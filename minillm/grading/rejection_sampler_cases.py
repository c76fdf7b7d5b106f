"""How exercise 05's checks run the learner's acceptance rules, `greedy_accept` and `stochastic_accept`:
hand-made cases with the output the rules give and the outputs of the usual mistakes (the draft's token
kept at a mismatch, a run that goes on after a rejection, a missing or misplaced bonus, a token drawn
from p instead of the residual, p(x) = 0 accepted, q(x) = 0 rejected, padding read as drafts), so that
a wrong output that matches one is named; and every call's output checked for shape, dtype and device,
its inputs for being left as they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minillm.grading.feedback import CheckFailed, call_learner, shape, spans
from minillm.sample.rejection_sampler import PAD

GREEDY_ARGS = ("target_token_ids", "draft_token_ids", "num_draft_tokens")
STOCHASTIC_ARGS = ("target_probs", "draft_probs", "draft_token_ids", "num_draft_tokens", "uniforms", "noise")

GREEDY_RULE = ("keep drafts while they equal the target's token at their position (target_token_ids[b, j]); at "
               "the first one that does not, emit the target's token instead and stop; if all num_draft_tokens[b] "
               "are kept, add the bonus target_token_ids[b, num_draft_tokens[b]]; PAD (-1) everywhere after")
STOCHASTIC_RULE = ("keep draft x at position j while u_j < p_j(x) / q_j(x); at the first rejection, draw from "
                   "max(0, p_j - q_j) and stop; if all num_draft_tokens[b] are kept, draw the bonus from "
                   "p at position num_draft_tokens[b]; a draw is argmax(w / noise); PAD (-1) everywhere after")
MISSING_BONUS = ("the bonus token is missing: when every real draft is kept, the target's pass has one more "
                 "position, right after them, and its token comes for free")
CONTINUED = ("tokens after the first rejection: once a draft is rejected, the drafts after it were guessed from "
             "a context that is now wrong; the run stops there (a running product of the accept flags, "
             "cumprod, keeps only the accepted prefix)")

OWN_RANDOMNESS = ("it draws random numbers of its own (torch.rand, torch.multinomial, ...). Use the ones given: "
                  "uniforms for the accept tests, noise for the one draw, argmax(w / noise); then a seeded request "
                  "gives the same tokens alone and in any batch")
RERUNS = 10  # calls that tell a function drawing its own random numbers from a deterministic mistake


@dataclasses.dataclass(frozen=True)
class Case:
    """Hand-made inputs, the output the rules give, and what the usual mistakes give instead."""

    title: str
    args: tuple[torch.Tensor, ...]
    expected: list[list[int]]
    mistakes: tuple[tuple[list[list[int]], str], ...] = ()
    too_many: str | None = None  # hint when the output has more tokens than expected
    too_few: str | None = None
    rows: tuple[str, ...] = ()  # what is special about each row, for a wrong batched output


def longs(rows: list[list[int]] | list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def floats(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _fmt(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return f"(empty, shape {shape(t)})"
    values = t.tolist() if not t.is_floating_point() else torch.round(t.double(), decimals=3).tolist()
    return str(values).replace(".0,", ",").replace(".0]", "]")


def describe(names: Sequence[str], args: Sequence[torch.Tensor]) -> str:
    return "\n".join(f"    {name} {shape(a)}: {_fmt(a)}" for name, a in zip(names, args))


def _emitted(row: list[int]) -> int:
    return next((i for i, t in enumerate(row) if t == PAD), len(row))


def validate(out: Any, batch: int, k: int, device: torch.device, name: str, case: str) -> torch.Tensor:
    """The learner returned [batch, k + 1] token ids, long, on the inputs' device."""
    want = f"a tensor of shape [{batch}, {k + 1}] (batch, k + 1) of torch.long token ids"
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(f"{name} returned {type(out).__name__}; expected {want}\n  on input: {case}")
    if tuple(out.shape) != (batch, k + 1):
        raise CheckFailed(f"{name} returned shape {shape(out)}; expected {want}: every row has room for its k "
                          f"drafts and one more token, PAD (-1) where it emits less\n  on input: {case}")
    if out.dtype != torch.long:
        raise CheckFailed(f"{name} returned dtype {out.dtype}; expected torch.long, the dtype of draft_token_ids "
                          f"(torch.full(..., PAD, dtype=torch.long) makes one)\n  on input: {case}")
    if out.device != device:
        raise CheckFailed(f"{name} returned a tensor on {out.device}, its inputs are on {device}: create new "
                          f"tensors with device=draft_token_ids.device\n  on input: {case}")
    return out


def call_on_copies(fn: Callable, name: str, names: Sequence[str], args: Sequence[torch.Tensor],
                   case: str) -> torch.Tensor:
    """The learner's function on copies of args; its output validated, and its inputs left as they were."""
    copies = [a.clone() for a in args]
    out = call_learner(fn, name, case, *copies)
    batch, k = args[names.index("draft_token_ids")].shape
    out = validate(out, batch, k, args[0].device, name, case)
    for arg_name, before, after in zip(names, args, copies):
        if not torch.equal(before, after):
            raise CheckFailed(f"{name} changed its input {arg_name} in place: the engine reads its inputs again "
                              f"afterwards (use out-of-place operations, or clone first)\n  on input: {case}")
    return out


def run_case(fn: Callable, name: str, names: Sequence[str], case: Case, rule: str) -> None:
    """rule: the hint for a wrong output that no known mistake explains."""
    got = call_on_copies(fn, name, names, case.args, case.title).tolist()
    if got == case.expected:
        return
    # A function that draws its own random numbers is wrong here by chance: say so, not what the case is about.
    for _ in range(RERUNS):
        if call_on_copies(fn, name, names, case.args, case.title).tolist() != got:
            raise CheckFailed(f"{name} gave different tokens for the same inputs ({case.title}): {OWN_RANDOMNESS}")
    hint = dict((tuple(map(tuple, out)), h) for out, h in case.mistakes).get(tuple(map(tuple, got)))
    wrong_rows = [b for b, (g, e) in enumerate(zip(got, case.expected)) if g != e]
    if hint is None and len(case.expected) == 1:
        longer = _emitted(got[0]) - _emitted(case.expected[0])
        hint = case.too_many if longer > 0 else case.too_few if longer < 0 else None
    if hint is None and case.rows:
        hint = "; ".join(f"row {b}: {case.rows[b]}" for b in wrong_rows)
    raise CheckFailed(f"{name}: wrong tokens on a hand-made case: {case.title}\n{describe(names, case.args)}\n"
                      f"  expected: {case.expected}\n  got:      {got}"
                      + (f" (rows {spans(wrong_rows)} differ)" if len(got) > 1 else "")
                      + f"\n  hint: {hint or rule}")
