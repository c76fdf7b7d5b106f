"""Checks for exercise 05, part 2: the learner's `stochastic_accept`, the rejection sampler's rule
for sampled drafts.

Hand-made cases come first: uniforms of 0 or 0.99 and noise of 1 that force each decision, so the
right output is known exactly, and so are the outputs of the usual mistakes. Then a chi-square test
at every position against the target's exact p, with a fixed seed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.grading.feedback import CheckFailed
from minillm.grading.rejection_sampler_cases import (
    CONTINUED,
    MISSING_BONUS,
    OWN_RANDOMNESS,
    STOCHASTIC_ARGS,
    STOCHASTIC_RULE,
    Case,
    call_on_copies,
    floats,
    longs,
    run_case,
)
from minillm.sample.rejection_sampler import PAD
from minillm.spec_decode.chi_square import chi_square

# The statistical test: N independent verifications of K drafts over V tokens, each row with a random
# number of real drafts. 40,000 rows reach the last position a few thousand times: enough for a rule
# that moves a token's frequency there by a few percent to fail, and the right rule passes with this seed.
V, K, N = 6, 3, 40_000
STAT_SEED = 0
MIN_P_VALUE = 1e-4


def stochastic_cases() -> list[Case]:
    ones = torch.ones(1, 5)
    from_p = ("you emitted the draft token that was just rejected (drawn from p, where it is likely): a rejected x "
              "has p(x) < q(x), so the residual max(0, p - q) gives it weight 0; draw from the residual")
    ratio = ("keep x with probability min(1, p(x) / q(x)): here p(x) / q(x) = 0.5 / 0.25 = 2, so x is kept "
             "whatever u (comparing u with p(x) alone, or with q(x) / p(x), rejects it)")
    return [
        Case("both drafts accepted, then the bonus from p at position k = 2",
             (floats([[[0, .7, .1, .1, .1], [.5, 0, .4, .1, 0], [0, 0, .2, .7, .1]]]),
              floats([[[0, .5, .5, 0, 0], [0, 0, .2, .8, 0]]]), longs([[1, 2]]), longs([2]), floats([[.5, 0]]), ones),
             [[1, 2, 3]],
             mistakes=(([[1, 2, 0]], "the bonus is off by one: drawn from p at position k - 1; it comes from "
                                     "target_probs[b, num_draft_tokens[b]], the distribution after the last draft"),
                       ([[1, 2, 4]], "the bonus was drawn from max(0, p - q): no draft was judged at the bonus "
                                     "position, so there is no q to subtract; draw from p itself")),
             too_few=MISSING_BONUS),
        Case("u = 0.6, p(x) = 0.5, q(x) = 0.25: accepted, as the ratio is 2",
             (floats([[[.45, .5, .05, 0, 0], [0, 0, 0, 1, 0]]]), floats([[[0, .25, .75, 0, 0]]]), longs([[1]]),
              longs([1]), floats([[.6]]), ones),
             [[1, 3]], mistakes=(([[0, PAD]], ratio),), too_few=MISSING_BONUS),
        Case("the second draft is rejected (u = 0.99 > p(x) / q(x) = 0.5 / 0.9): its replacement comes from the "
             "residual, and the run stops",
             (floats([[[0, .7, .1, .1, .1], [.1, .2, 0, .5, .2], [0, 0, 1, 0, 0], [0, 0, 0, 0, 1]]]),
              floats([[[0, .5, .5, 0, 0], [0, 0, 0, .9, .1], [0, 0, 1, 0, 0]]]), longs([[1, 3, 2]]), longs([3]),
              floats([[0, .99, 0]]), ones),
             [[1, 1, PAD, PAD]], mistakes=(([[1, 3, PAD, PAD]], from_p),), too_many=CONTINUED,
             too_few="a rejection still emits a token, drawn from the residual max(0, p - q), in the rejected "
                     "draft's place"),
        Case("p(x) = 0: the target never produces x = 0, so it is rejected even with u = 0",
             (floats([[[0, .6, .4, 0, 0], [0, 0, 0, 0, 1]]]), floats([[[.5, .5, 0, 0, 0]]]), longs([[0]]), longs([1]),
              floats([[0.]]), ones),
             [[2, PAD]],
             too_many="you accepted a token the target gives probability 0: the test is strict, u < p(x) / q(x) "
                      "(u <= p / q accepts x when u = 0), so the target's impossible tokens are never emitted"),
        Case("q(x) = 0 < p(x): the draft gave x = 3 no chance, the target some; p(x) / q(x) is infinite, so x is "
             "kept whatever u",
             (floats([[[0, 0, 0, .2, .8], [1, 0, 0, 0, 0]]]), floats([[[.5, .5, 0, 0, 0]]]), longs([[3]]), longs([1]),
              floats([[.99]]), ones),
             [[3, 0]],
             mistakes=(([[4, PAD]], "you rejected x although q(x) = 0 and p(x) > 0: guarding the division so that "
                                    "p / q becomes 0 (or NaN) where q = 0 rejects it; u * q(x) < p(x) needs no "
                                    "division at all"),),
             too_few=MISSING_BONUS),
        Case("a draw from the residual [0, .5, .3, 0, 0] with noise [1, 1, 0.1, 1, 1]: argmax(w / noise) is token 2",
             (floats([[[.2, .5, .3, 0, 0], [0, 0, 0, 0, 1]]]), floats([[[1, 0, 0, 0, 0]]]), longs([[0]]), longs([1]),
              floats([[.5]]), floats([[1, 1, .1, 1, 1]])),
             [[2, PAD]],
             mistakes=(([[1, PAD]], "you took the residual's most likely token (argmax(w), or argmax(w * noise)): "
                                    "draw from it, with the noise given: argmax(w / noise) picks token i with "
                                    "probability w_i / sum(w), even when w is not normalized"),)),
        Case("rows with fewer real drafts than k = 3 (draft_token_ids holds PAD = -1 after them, which is no "
             "token id: clamp before indexing; the probabilities and uniforms there are padding, not to be read)",
             (floats([[[0, .7, .1, .1, .1], [.5, 0, .4, .1, 0], [0, 0, .2, .7, .1], [0, 1, 0, 0, 0]],
                      [[0, 0, .9, .1, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]],
                      [[0, 0, .3, 0, .7], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]]),
              floats([[[0, .5, .5, 0, 0], [0, 0, .2, .8, 0], [0, 1, 0, 0, 0]],
                      [[0, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]],
                      [[0, 0, 0, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]]),
              longs([[1, 2, 1], [2, PAD, PAD], [PAD, PAD, PAD]]), longs([3, 1, 0]),
              floats([[.5, 0, .99], [0, 0, 0], [0, 0, 0]]), torch.ones(3, 5)),
             [[1, 2, 3, PAD], [2, 4, PAD, PAD], [4, PAD, PAD, PAD]],
             rows=("3 real drafts: two kept, the third rejected (p(x) = 0), then the residual's token",
                   "1 real draft, kept: the bonus comes from target_probs[1, 1], not from a padding position",
                   "no drafts (num_draft_tokens = 0): its token comes from p itself, target_probs[2, 0]; subtract q "
                   "only after a real draft was rejected (position < num_draft_tokens)")),
        Case("k = 0: no drafts (draft_token_ids [2, 0], draft_probs [2, 0, 5]): each row draws from p at position 0",
             (floats([[[.6, .4, 0, 0, 0]], [[0, 0, 0, .1, .9]]]), torch.zeros(2, 0, 5),
              torch.zeros(2, 0, dtype=torch.long), longs([0, 0]), torch.zeros(2, 0),
              floats([[1, .5, 1e-3, 1, 1], [1, 1, 1, 1, 1]])),
             [[1], [4]]),
    ]


def check_stochastic_accept(stochastic_accept: Callable) -> None:
    """Hand-made cases; the same output twice for the same inputs; then every position's tokens against
    the target's p (chi-square, fixed seed)."""
    cases = stochastic_cases()
    for case in cases:
        run_case(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS, case, STOCHASTIC_RULE)
    args, p = statistical_inputs()
    title = f"{N} random rows, k = {K}, V = {V}"
    out = call_on_copies(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS, args, title)
    if not torch.equal(out, call_on_copies(stochastic_accept, "stochastic_accept", STOCHASTIC_ARGS, args, title)):
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
