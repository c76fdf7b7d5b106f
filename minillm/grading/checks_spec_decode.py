"""Checks for exercise 05, speculative decoding: the learner's `greedy_accept` and `stochastic_accept`,
the two rules of the rejection sampler, and both of them verifying drafts in the real engine.

Hand-made cases come first: tiny vocabularies, uniforms of 0 or 0.99 and noise of 1 that force each
decision, so the right output is known exactly, and so are the outputs of the usual mistakes (the
draft's token kept at a mismatch, a run that goes on after a rejection, a missing or misplaced bonus,
a token drawn from p instead of the residual, p(x) = 0 accepted, q(x) = 0 rejected, padding read as
drafts); a wrong output that matches one is named. Then `greedy_accept` meets the reference on random
batches, and `stochastic_accept` a chi-square test at every position against the target's exact p,
with fixed seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import torch

from minillm import sequence
from minillm.engine.model_runner import sequence_logits
from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner, shape, spans
from minillm.llm import LLM
from minillm.sample import rejection_sampler
from minillm.sample.rejection_sampler import PAD, RejectionSampler
from minillm.sample.sampler import SamplingMetadata, sampling_probs
from minillm.sampling_params import SamplingParams
from minillm.spec_decode.chi_square import chi_square, p_value

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

# The statistical test: N independent verifications of K drafts over V tokens, each row with a random
# number of real drafts. 40,000 rows reach the last position a few thousand times: enough for a rule
# that moves a token's frequency there by a few percent to fail, and the right rule passes with this seed.
V, K, N = 6, 3, 40_000
STAT_SEED = 0
MIN_P_VALUE = 1e-4

# The engine check: seeded requests of 3 tokens at temperature 1. The first token ends the prompt's
# prefill; the step after it verifies a draft for the second, so that token went through the
# learner's function (accepted, or drawn from the residual).
ENGINE_PROMPT = "def fibonacci(n):\n"
ENGINE_REQUESTS = 800
ENGINE_PARAMS = SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True)
ENGINE_MIN_P_VALUE = 1e-3
MIN_GROUP = 20  # requests sharing a first token, for their second tokens to be tested


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


def _long(rows: list[list[int]] | list[int]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def _probs(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def greedy_cases() -> list[Case]:
    target = _long([[5, 2, 7, 1]])
    off_by_one = "the bonus is off by one: it is the target's token after the last draft, target_token_ids[b, 3] here"
    draft_kept = ("at the first mismatch you emitted the draft's token: emit the target's there (that is what "
                  "decoding without speculation would produce)")
    return [
        Case("every draft matches the target: all 3 are kept, then the bonus",
             (target, _long([[5, 2, 7]]), _long([3])), [[5, 2, 7, 1]],
             mistakes=(([[5, 2, 7, 7]], off_by_one),), too_few=MISSING_BONUS),
        Case("the second draft differs from the target: the target's token replaces it, and the run stops",
             (target, _long([[5, 3, 7]]), _long([3])), [[5, 2, PAD, PAD]],
             mistakes=(([[5, 3, PAD, PAD]], draft_kept),), too_many=CONTINUED,
             too_few="the target's token at the first mismatch is missing: a rejection still emits one token, "
                     "the target's, so that every step makes progress"),
        Case("the first draft already differs: only the target's first token is emitted",
             (target, _long([[9, 2, 7]]), _long([3])), [[5, PAD, PAD, PAD]],
             mistakes=(([[9, PAD, PAD, PAD]], draft_kept),), too_many=CONTINUED),
        Case("rows with fewer real drafts than k = 3 (after them, draft_token_ids holds PAD = -1 and "
             "target_token_ids padding)",
             (_long([[4, 4, 6, 8], [3, 9, 9, 9], [1, 2, 3, 4]]), _long([[4, 4, PAD], [PAD, PAD, PAD], [1, 2, 3]]),
              _long([2, 0, 3])),
             [[4, 4, 6, PAD], [3, PAD, PAD, PAD], [1, 2, 3, 4]],
             rows=("2 real drafts, both kept: the bonus is target_token_ids[0, 2]",
                   "no drafts (num_draft_tokens = 0): just the target's token at position 0",
                   "3 real drafts, all kept: the bonus is target_token_ids[2, 3]")),
        Case("k = 0: no drafts at all (draft_token_ids has shape [2, 0]); each row emits the target's token",
             (_long([[3], [6]]), torch.zeros(2, 0, dtype=torch.long), _long([0, 0])), [[3], [6]]),
    ]


def stochastic_cases() -> list[Case]:
    ones = torch.ones(1, 5)
    from_p = ("you emitted the draft token that was just rejected (drawn from p, where it is likely): a rejected x "
              "has p(x) < q(x), so the residual max(0, p - q) gives it weight 0; draw from the residual")
    ratio = ("keep x with probability min(1, p(x) / q(x)): here p(x) / q(x) = 0.5 / 0.25 = 2, so x is kept "
             "whatever u (comparing u with p(x) alone, or with q(x) / p(x), rejects it)")
    return [
        Case("both drafts accepted, then the bonus from p at position k = 2",
             (_probs([[[0, .7, .1, .1, .1], [.5, 0, .4, .1, 0], [0, 0, .2, .7, .1]]]),
              _probs([[[0, .5, .5, 0, 0], [0, 0, .2, .8, 0]]]), _long([[1, 2]]), _long([2]), _probs([[.5, 0]]), ones),
             [[1, 2, 3]],
             mistakes=(([[1, 2, 0]], "the bonus is off by one: drawn from p at position k - 1; it comes from "
                                     "target_probs[b, num_draft_tokens[b]], the distribution after the last draft"),
                       ([[1, 2, 4]], "the bonus was drawn from max(0, p - q): no draft was judged at the bonus "
                                     "position, so there is no q to subtract; draw from p itself")),
             too_few=MISSING_BONUS),
        Case("u = 0.6, p(x) = 0.5, q(x) = 0.25: accepted, as the ratio is 2",
             (_probs([[[.45, .5, .05, 0, 0], [0, 0, 0, 1, 0]]]), _probs([[[0, .25, .75, 0, 0]]]), _long([[1]]),
              _long([1]), _probs([[.6]]), ones),
             [[1, 3]], mistakes=(([[0, PAD]], ratio),), too_few=MISSING_BONUS),
        Case("the second draft is rejected (u = 0.99 > p(x) / q(x) = 0.5 / 0.9): its replacement comes from the "
             "residual, and the run stops",
             (_probs([[[0, .7, .1, .1, .1], [.1, .2, 0, .5, .2], [0, 0, 1, 0, 0], [0, 0, 0, 0, 1]]]),
              _probs([[[0, .5, .5, 0, 0], [0, 0, 0, .9, .1], [0, 0, 1, 0, 0]]]), _long([[1, 3, 2]]), _long([3]),
              _probs([[0, .99, 0]]), ones),
             [[1, 1, PAD, PAD]], mistakes=(([[1, 3, PAD, PAD]], from_p),), too_many=CONTINUED,
             too_few="a rejection still emits a token, drawn from the residual max(0, p - q), in the rejected "
                     "draft's place"),
        Case("p(x) = 0: the target never produces x = 0, so it is rejected even with u = 0",
             (_probs([[[0, .6, .4, 0, 0], [0, 0, 0, 0, 1]]]), _probs([[[.5, .5, 0, 0, 0]]]), _long([[0]]), _long([1]),
              _probs([[0.]]), ones),
             [[2, PAD]],
             too_many="you accepted a token the target gives probability 0: the test is strict, u < p(x) / q(x) "
                      "(u <= p / q accepts x when u = 0), so the target's impossible tokens are never emitted"),
        Case("q(x) = 0 < p(x): the draft gave x = 3 no chance, the target some; p(x) / q(x) is infinite, so x is "
             "kept whatever u",
             (_probs([[[0, 0, 0, .2, .8], [1, 0, 0, 0, 0]]]), _probs([[[.5, .5, 0, 0, 0]]]), _long([[3]]), _long([1]),
              _probs([[.99]]), ones),
             [[3, 0]],
             mistakes=(([[4, PAD]], "you rejected x although q(x) = 0 and p(x) > 0: guarding the division so that "
                                    "p / q becomes 0 (or NaN) where q = 0 rejects it; u * q(x) < p(x) needs no "
                                    "division at all"),),
             too_few=MISSING_BONUS),
        Case("a draw from the residual [0, .5, .3, 0, 0] with noise [1, 1, 0.1, 1, 1]: argmax(w / noise) is token 2",
             (_probs([[[.2, .5, .3, 0, 0], [0, 0, 0, 0, 1]]]), _probs([[[1, 0, 0, 0, 0]]]), _long([[0]]), _long([1]),
              _probs([[.5]]), _probs([[1, 1, .1, 1, 1]])),
             [[2, PAD]],
             mistakes=(([[1, PAD]], "you took the residual's most likely token (argmax(w), or argmax(w * noise)): "
                                    "draw from it, with the noise given: argmax(w / noise) picks token i with "
                                    "probability w_i / sum(w), even when w is not normalized"),)),
        Case("rows with fewer real drafts than k = 3 (draft_token_ids holds PAD = -1 after them, which is no "
             "token id: clamp before indexing; the probabilities and uniforms there are padding, not to be read)",
             (_probs([[[0, .7, .1, .1, .1], [.5, 0, .4, .1, 0], [0, 0, .2, .7, .1], [0, 1, 0, 0, 0]],
                      [[0, 0, .9, .1, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]],
                      [[0, 0, .3, 0, .7], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]]),
              _probs([[[0, .5, .5, 0, 0], [0, 0, .2, .8, 0], [0, 1, 0, 0, 0]],
                      [[0, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]],
                      [[0, 0, 0, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]]),
              _long([[1, 2, 1], [2, PAD, PAD], [PAD, PAD, PAD]]), _long([3, 1, 0]),
              _probs([[.5, 0, .99], [0, 0, 0], [0, 0, 0]]), torch.ones(3, 5)),
             [[1, 2, 3, PAD], [2, 4, PAD, PAD], [4, PAD, PAD, PAD]],
             rows=("3 real drafts: two kept, the third rejected (p(x) = 0), then the residual's token",
                   "1 real draft, kept: the bonus comes from target_probs[1, 1], not from a padding position",
                   "no drafts (num_draft_tokens = 0): its token comes from p itself, target_probs[2, 0]; subtract q "
                   "only after a real draft was rejected (position < num_draft_tokens)")),
        Case("k = 0: no drafts (draft_token_ids [2, 0], draft_probs [2, 0, 5]): each row draws from p at position 0",
             (_probs([[[.6, .4, 0, 0, 0]], [[0, 0, 0, .1, .9]]]), torch.zeros(2, 0, 5),
              torch.zeros(2, 0, dtype=torch.long), _long([0, 0]), torch.zeros(2, 0),
              _probs([[1, .5, 1e-3, 1, 1], [1, 1, 1, 1, 1]])),
             [[1], [4]]),
    ]


def _fmt(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return f"(empty, shape {shape(t)})"
    values = t.tolist() if not t.is_floating_point() else torch.round(t.double(), decimals=3).tolist()
    return str(values).replace(".0,", ",").replace(".0]", "]")


def _describe(names: Sequence[str], args: Sequence[torch.Tensor]) -> str:
    return "\n".join(f"    {name} {shape(a)}: {_fmt(a)}" for name, a in zip(names, args))


def _emitted(row: list[int]) -> int:
    return next((i for i, t in enumerate(row) if t == PAD), len(row))


def _validate(out: Any, batch: int, k: int, device: torch.device, name: str, case: str) -> torch.Tensor:
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


def _call(fn: Callable, name: str, names: Sequence[str], args: Sequence[torch.Tensor], case: str) -> torch.Tensor:
    """The learner's function on copies of args; its output validated, and its inputs left as they were."""
    copies = [a.clone() for a in args]
    out = call_learner(fn, name, case, *copies)
    batch, k = args[names.index("draft_token_ids")].shape
    out = _validate(out, batch, k, args[0].device, name, case)
    for arg_name, before, after in zip(names, args, copies):
        if not torch.equal(before, after):
            raise CheckFailed(f"{name} changed its input {arg_name} in place: the engine reads its inputs again "
                              f"afterwards (use out-of-place operations, or clone first)\n  on input: {case}")
    return out


def _run_case(fn: Callable, name: str, names: Sequence[str], case: Case, rule: str) -> None:
    """rule: the hint for a wrong output that no known mistake explains."""
    got = _call(fn, name, names, case.args, case.title).tolist()
    if got == case.expected:
        return
    # A function that draws its own random numbers is wrong here by chance: say so, not what the case is about.
    for _ in range(RERUNS):
        if _call(fn, name, names, case.args, case.title).tolist() != got:
            raise CheckFailed(f"{name} gave different tokens for the same inputs ({case.title}): {OWN_RANDOMNESS}")
    hint = dict((tuple(map(tuple, out)), h) for out, h in case.mistakes).get(tuple(map(tuple, got)))
    wrong_rows = [b for b, (g, e) in enumerate(zip(got, case.expected)) if g != e]
    if hint is None and len(case.expected) == 1:
        longer = _emitted(got[0]) - _emitted(case.expected[0])
        hint = case.too_many if longer > 0 else case.too_few if longer < 0 else None
    if hint is None and case.rows:
        hint = "; ".join(f"row {b}: {case.rows[b]}" for b in wrong_rows)
    raise CheckFailed(f"{name}: wrong tokens on a hand-made case: {case.title}\n{_describe(names, case.args)}\n"
                      f"  expected: {case.expected}\n  got:      {got}"
                      + (f" (rows {spans(wrong_rows)} differ)" if len(got) > 1 else "")
                      + f"\n  hint: {hint or rule}")


def check_greedy_accept(greedy_accept: Callable) -> None:
    """Hand-made cases, then random batches against the reference."""
    cases = greedy_cases()
    for case in cases:
        _run_case(greedy_accept, "greedy_accept", GREEDY_ARGS, case, GREEDY_RULE)
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
    got = _call(greedy_accept, "greedy_accept", GREEDY_ARGS, args, f"{batch} random rows, k = {k}")
    expected = rejection_sampler.greedy_accept(*args)
    wrong = (got != expected).any(dim=1).nonzero().flatten().tolist()
    if wrong:
        b = wrong[0]
        raise CheckFailed(f"greedy_accept: {len(wrong)} of {batch} random rows (k = {k}) are wrong; the first, "
                          f"row {b}:\n{_describe(GREEDY_ARGS, [a[b:b + 1] for a in args])}\n  expected: "
                          f"{expected[b].tolist()}\n  got:      {got[b].tolist()}\n  hint: rows are independent: "
                          f"{GREEDY_RULE}")
    return batch


def check_stochastic_accept(stochastic_accept: Callable) -> None:
    """Hand-made cases; the same output twice for the same inputs; then every position's tokens against
    the target's p (chi-square, fixed seed)."""
    cases = stochastic_cases()
    for case in cases:
        _run_case(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS, case, STOCHASTIC_RULE)
    args, p = statistical_inputs()
    title = f"{N} random rows, k = {K}, V = {V}"
    out = _call(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS, args, title)
    if not torch.equal(out, _call(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS, args, title)):
        raise CheckFailed(f"stochastic_accept gave different tokens for the same inputs ({title}): {OWN_RANDOMNESS}")
    _check_positions(out, args[STOCHASTIC_ARGS.index("num_draft_tokens")], p)
    print(f"check_stochastic_accept passed: {len(cases)} hand-made cases (accept, reject, residual, bonus, "
          f"p = 0, q = 0, padding, k = 0), then every position of {N} random verifications distributed as p "
          f"(chi-square, p-values >= {MIN_P_VALUE:g})")


def statistical_inputs(seed: int = STAT_SEED) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The arguments of N verifications (drafts drawn from q, 0..K real ones per row, padding elsewhere)
    and the target's p [K + 1, V]. Each q is its p plus some noise: most drafts are kept, so every
    position is reached often, and enough are rejected for the residual to be tested too. p and q hold
    zeros: token 0 the target never produces but the draft proposes, token 1 the other way round."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(K + 1, V, generator=gen) ** 2
    p[:, 0] = 0
    p = p / p.sum(-1, keepdim=True)
    q = p[:K] + torch.rand(K, V, generator=gen) ** 2 / V
    q[:, 1] = 0
    q = q / q.sum(-1, keepdim=True)
    num = torch.randint(0, K + 1, (N,), generator=gen)
    drafts = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=gen) for j in range(K)], dim=1)
    real = torch.arange(K) < num[:, None]
    # Unlike the engine's padding (copies of real rows), random values: a function that reads them shows it.
    garbage_p, garbage_q = torch.rand(N, K + 1, V, generator=gen), torch.rand(N, K, V, generator=gen)
    target_probs = torch.where((torch.arange(K + 1) <= num[:, None])[..., None], p, garbage_p)
    draft_probs = torch.where(real[..., None], q, garbage_q)
    args = (target_probs, draft_probs, torch.where(real, drafts, PAD), num, torch.rand(N, K, generator=gen),
            torch.empty(N, V).exponential_(generator=gen))
    return args, p


def _check_positions(out: torch.Tensor, num: torch.Tensor, p: torch.Tensor) -> None:
    """The layout of each row, then each position's tokens against p at that position: a row
    reaches position j when its first j drafts were kept."""
    if ((out < PAD) | (out >= V)).any():
        raise CheckFailed(f"stochastic_accept emitted a token id outside 0..{V - 1}, for a vocabulary of {V}")
    emitted = (out != PAD).long()
    length = emitted.sum(dim=1)
    bad = ((emitted.cumprod(dim=1).sum(dim=1) != length) | (length == 0) | (length > num + 1)).nonzero()
    if len(bad):
        b = bad[0, 0].item()
        raise CheckFailed(f"stochastic_accept: row {b} of the random rows is {out[b].tolist()} with "
                          f"num_draft_tokens = {num[b].item()}: each row holds 1 to num_draft_tokens + 1 tokens, "
                          "then PAD (-1) only")
    for j in range(K + 1):
        reached = length > j
        counts = torch.bincount(out[reached, j], minlength=V)
        _, _, value = chi_square(counts, p[j])
        if value < MIN_P_VALUE:
            raise CheckFailed(_distribution_message(j, counts, p[j], value))


def _distribution_message(j: int, counts: torch.Tensor, p: torch.Tensor, value: float) -> str:
    freq = counts.double() / counts.sum()
    worst = (freq - p.double()).abs().argmax().item()
    where = ("the first position: an accepted first draft, or the residual's token after rejecting it, or, for "
             "rows without drafts, a draw from p" if j == 0 else
             f"position {j}: reached when the first {j} drafts were kept; an accepted draft, the residual's "
             "token, or the bonus")
    return (f"stochastic_accept: at {where}, the tokens emitted are not distributed as the target's p there "
            f"(chi-square p-value {value:.2g} over {counts.sum().item()} rows that reached it)\n"
            f"  token {worst}: p = {p[worst].item():.3f}, emitted {freq[worst].item():.3f} of the time\n"
            f"  hint: {STOCHASTIC_RULE}. Speculative sampling is exact only if every rule holds: each emitted "
            "token is then distributed as p, whatever q")


def _keep_nothing(target_token_ids: torch.Tensor, draft_token_ids: torch.Tensor,
                  num_draft_tokens: torch.Tensor) -> torch.Tensor:
    """A greedy_accept that keeps no draft: each step emits the target's own next token, which is
    greedy decoding without speculation."""
    return rejection_sampler.greedy_accept(target_token_ids, draft_token_ids, torch.zeros_like(num_draft_tokens))


def check_engine(greedy_accept: Callable, stochastic_accept: Callable, llm: LLM) -> None:
    """The learner's functions as the engine's rejection sampler: greedy output token for token that
    of decoding without speculation; sampled output distributed as the target's."""
    sampler = llm.llm_engine.model_runner.rejection_sampler
    if sampler is None:
        raise CheckFailed("this LLM does not speculate: create it with speculative_config={'model': "
                          "course.draft_model, 'num_speculative_tokens': 4}")
    k = sampler.k
    try:
        done = check_generation(llm, sampler, "greedy_accept", _keep_nothing,
                                _validated(greedy_accept, "greedy_accept", GREEDY_ARGS), "greedy_accept")
    except CheckFailed as e:
        if not str(e).startswith("with your greedy_accept in the engine, "):
            raise  # not implemented, raised, or returned the wrong shape: the message says it all
        raise CheckFailed(f"{e}\n  hint: the reference is decoding without speculation, which the step named "
                          f"above describes; the engine verifies up to k = {k} drafts per step. If the checks of "
                          f"Part 1 pass, look at what differs in the engine: rows with fewer drafts than k, a "
                          f"batch of several rows. {GREEDY_RULE}") from None
    value = _engine_p_value(llm, sampler, stochastic_accept)
    if value < ENGINE_MIN_P_VALUE:
        raise CheckFailed(f"with your stochastic_accept in the engine, sampled tokens are not distributed as the "
                          f"target's: the second token of {ENGINE_REQUESTS} seeded requests at temperature 1 (each "
                          f"verified as a draft, k = {k}) against the target's exact distribution, chi-square "
                          f"p-value {value:.2g}\n  hint: if the checks of Part 2 pass, look at what differs in the "
                          f"engine: a vocabulary of {llm.llm_engine.model_config.vocab_size} tokens, rows with "
                          f"fewer drafts than k, a batch of many rows. {STOCHASTIC_RULE}")
    print(f"check_engine passed: greedy, {done.replace('the reference', 'decoding without speculation')}; "
          f"sampled, the second token of {ENGINE_REQUESTS} seeded requests is distributed as the target's "
          f"(chi-square p-value {value:.2g})")


def _validated(fn: Callable, name: str, names: Sequence[str]) -> Callable:
    """fn as the engine calls it, its output checked before the engine uses it."""
    def call(*args: torch.Tensor) -> torch.Tensor:
        case = "a call from the engine with " + ", ".join(f"{n} {shape(a)}" for n, a in zip(names, args))
        batch, k = args[names.index("draft_token_ids")].shape
        return _validate(call_learner(fn, name, case, *args), batch, k, args[0].device, name, case)
    return call


def _engine_p_value(llm: LLM, sampler: RejectionSampler, stochastic_accept: Callable) -> float:
    learner = _validated(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS)
    prompt = llm.llm_engine.process_prompt(ENGINE_PROMPT)[1]
    with mock.patch.object(sampler, "stochastic_accept", learner):
        try:
            return second_token_p_value(llm, prompt, ENGINE_PARAMS, ENGINE_REQUESTS)
        except CheckFailed:
            raise
        except Exception as e:
            raise CheckFailed(f"the engine failed with your stochastic_accept in place ({type(e).__name__}: "
                              f"{e})") from e


def second_token_p_value(llm: LLM, prompt: list[int], params: SamplingParams, n: int) -> float:
    """n requests seeded 0..n-1; the second token of each was the first one speculation produced (the
    first ends the prompt's prefill). After each first token a that MIN_GROUP requests or more share,
    the second tokens are tested against the target's exact p(. | prompt, a); the tests are combined."""
    outs = llm.generate([{"prompt_token_ids": prompt}] * n, [dataclasses.replace(params, seed=i) for i in range(n)],
                        use_tqdm=False)
    pairs = torch.tensor([o.outputs[0].token_ids[:2] for o in outs])
    counts = pairs[:, 0].bincount()
    firsts = (counts >= MIN_GROUP).nonzero().flatten().tolist()
    exact = exact_next_token_probs(llm, [prompt + [a] for a in firsts], params)
    statistic, dof = 0.0, 0
    for a, probs in zip(firsts, exact):
        seconds = torch.bincount(pairs[pairs[:, 0] == a, 1], minlength=len(probs))
        s, d, _ = chi_square(seconds, probs)
        statistic, dof = statistic + s, dof + d
    return p_value(statistic, dof)


def exact_next_token_probs(llm: LLM, sequences: list[list[int]], params: SamplingParams) -> torch.Tensor:
    """The target's next-token distribution after each sequence, under params' filters, [len, V]: no
    cache, no batching with anything else."""
    with torch.inference_mode():
        logits = torch.stack([x[-1] for x in sequence_logits(llm.llm_engine.model, sequences)])
    meta = SamplingMetadata.from_seqs([sequence.Sequence("p", None, s, params) for s in sequences], logits.device)
    return sampling_probs(logits, meta).cpu()
