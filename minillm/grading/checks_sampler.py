"""Checks for exercise 00, parts 1 and 2: the learner's `sample`, the engine's sampler for one setting.

Part 1: temperature 0 is each row's argmax; other temperatures, tested by their draws' distribution,
on logits as large as a model's too (a softmax written without subtracting the max overflows); and
the generator given decides the draws. Part 2: min_p, top_k and top_p, each on a row built so
that its usual mistakes (one token too many or too few at top_p's boundary, min_p absolute or before
the temperature, top_k's ties, top_p measured before renormalizing) draw from distributions far from
the right one, and are named.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.grading.feedback import CheckFailed
from minillm.grading.sampler_cases import (
    DRAWS,
    OWN_RANDOMNESS,
    Case,
    Settings,
    call_sample,
    check_case,
    kept,
    normalized,
)

# The distribution most cases start from, readable at a glance; its logits are its logs, shifted so
# that some are negative and some positive.
P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
P_TIED = torch.tensor([0.40, 0.20, 0.20, 0.10, 0.06, 0.04], dtype=torch.float64)
GREEDY_ROWS, GREEDY_VOCAB = 16, 50
# Divided by a temperature of 0.5, every logit of its case is past 88, where exp overflows float32.
LARGE_LOGIT = 60.0
TOP_P_OFF = ("the least likely token never came out: top_p = 1 must keep every token (a cumulative sum in float32 "
             "can end a hair away from 1, so skip top_p when it is 1)")


def logits_of(probs: torch.Tensor) -> torch.Tensor:
    return (probs.log() + 2).float()


def temperature_cases() -> list[Case]:
    after_softmax = ("you applied the temperature after the softmax: dividing the probabilities by it scales every "
                     "token alike, so once renormalized nothing changed (and a second softmax of them is another "
                     "distribution again); divide the logits, then take the softmax")
    multiplied = ("you multiplied the logits by the temperature: divide them, so that a temperature below 1 "
                  "sharpens the distribution and one above 1 flattens it")

    def case(t: float) -> Case:
        return Case(f"temperature {t}: the softmax of logits / {t}", logits_of(P), Settings(temperature=t),
                    mistakes=((P, after_softmax), (torch.softmax(P / t, dim=0), after_softmax),
                              (normalized(P ** t), multiplied)))

    # A model's logits reach the tens, and a low temperature multiplies them: exp of one past 88
    # overflows float32, so a softmax that does not subtract the row's max first gives NaN, and the
    # argmax of NaN is token 0.
    overflowed = ("the softmax overflowed: exp of a logit above 88 is inf in float32, and inf / inf is NaN; "
                  "subtract each row's largest logit before exp (torch.softmax does it for you)")
    large = Case(f"temperature 0.5 on logits as large as a model's (up to {LARGE_LOGIT:g}): a softmax that "
                 "does not subtract the row's max overflows", logits_of(P) + LARGE_LOGIT - 2, Settings(temperature=0.5),
                 mistakes=((kept(P, [0]), overflowed),))

    # At temperature 1 only a second softmax changes the distribution.
    return [Case("temperature 1: the softmax of the logits themselves", logits_of(P), Settings(),
                 mistakes=((torch.softmax(P, dim=0), after_softmax), (kept(P, [0, 1, 2, 3, 4]), TOP_P_OFF))),
            case(0.5), case(2.0), large]


def filter_cases() -> list[Case]:
    at_temperature_2 = normalized(P ** 0.5)
    top_p_too_few = ("one token too few: top_p keeps the smallest set of most likely tokens whose probabilities sum "
                     "to at least top_p, so the token that takes the sum past top_p stays (drop a token only when "
                     "the more likely tokens before it already hold top_p)")
    top_p_too_many = ("one token too many: top_p keeps the smallest set of most likely tokens whose probabilities "
                      "sum to at least top_p; once the tokens before one hold top_p, that one goes")
    return [
        Case("top_k = 0 keeps every token (off)", logits_of(P), Settings(top_k=0)),
        Case("top_k = -1 keeps every token (off, vLLM's other spelling of 0)", logits_of(P), Settings(top_k=-1)),
        Case("top_k = 10, more than the 6 tokens of the vocabulary: every token stays", logits_of(P),
             Settings(top_k=10)),
        Case("top_p = 1 keeps every token (off)", logits_of(P), Settings(top_p=1.0),
             mistakes=((kept(P, [0, 1, 2, 3, 4]), TOP_P_OFF),)),
        Case("top_k = 3: the 3 most likely tokens", logits_of(P), Settings(top_k=3),
             mistakes=((kept(P, [0, 1]), "one token too few: keep the k largest logits, the k-th included"),
                       (kept(P, [0, 1, 2, 3]), "one token too many: keep the k largest logits, no more"))),
        Case("top_k = 2 where the 2nd and 3rd most likely are tied: tokens tied with the k-th stay too",
             logits_of(P_TIED), Settings(top_k=2),
             mistakes=tuple((kept(P_TIED, tokens), "tokens tied with the k-th largest logit stay too (vLLM's rule): "
                                                   "keep logits >= the k-th largest value (topk(...).values), not "
                                                   "exactly the k indices topk returns")
                            for tokens in ([0, 1], [0, 2]))),
        Case("top_p = 0.7: tokens 0 and 1 hold 0.65, less than 0.7, so token 2 stays too", logits_of(P),
             Settings(top_p=0.7), mistakes=((kept(P, [0, 1]), top_p_too_few), (kept(P, [0, 1, 2, 3]), top_p_too_many))),
        Case("min_p = 0.3: tokens with p >= 0.3 * 0.4 = 0.12 stay", logits_of(P), Settings(min_p=0.3),
             mistakes=((kept(P, [0]), "min_p is relative to the most likely token: keep p >= min_p * p_max; you "
                                      "compared p with min_p itself"),)),
        Case("min_p = 0.45 at temperature 2: min_p compares the probabilities of logits / 2", logits_of(P),
             Settings(temperature=2.0, min_p=0.45),
             mistakes=((kept(at_temperature_2, [0, 1]), "min_p applies after the temperature: compare the "
                                                        "probabilities of logits / temperature, not of the logits"),)),
        Case("top_k = 3, then top_p = 0.75 of what top_k left (0.5, 0.31, 0.19 once renormalized)", logits_of(P),
             Settings(top_k=3, top_p=0.75),
             mistakes=((kept(P, [0, 1, 2]), "top_p measures what min_p and top_k left, renormalized: take the "
                                             "softmax again after them, then the cumulative sum (vLLM's order: "
                                             "temperature, min_p, top_k, top_p)"),)),
        Case("all four at once, each doing its part: min_p drops tokens 5 to 7, top_k token 4, top_p token 3",
             torch.tensor([3.0, 2.6, 2.2, 1.3, 0.4, -0.5, -1.5, -3.0]),
             Settings(temperature=1.5, top_k=4, top_p=0.85, min_p=0.1)),
    ]


def check_temperature(sample: Callable) -> None:
    """Greedy rows; each temperature's distribution; the generator's seed decides the draws."""
    logits = torch.randn(GREEDY_ROWS, GREEDY_VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    title = f"temperature 0 (greedy) on {GREEDY_ROWS} rows of random logits over {GREEDY_VOCAB} tokens"
    greedy = call_sample(sample, logits, Settings(temperature=0.0), torch.Generator().manual_seed(0), title)
    if not torch.equal(greedy, logits.argmax(dim=-1)):
        raise CheckFailed(f"sample: wrong tokens at temperature 0 ({title})\n  expected: "
                          f"{logits.argmax(dim=-1).tolist()}\n  got:      {greedy.tolist()}\n  hint: temperature 0 "
                          "means greedy: return each row's argmax, before dividing by it (x / 0 is inf, and the "
                          "softmax of inf is NaN)")
    cases = temperature_cases()
    for seed, case in enumerate(cases):
        check_case(sample, case, seed)
    _check_seeding(sample, cases[0])
    print(f"check_temperature passed: greedy rows are their argmax; temperatures "
          f"{', '.join(sorted({str(c.settings.temperature) for c in cases}))}, and logits up to {LARGE_LOGIT:g}, "
          f"draw as they should ({DRAWS} draws each, chi-square); the generator's seed decides the tokens")


def _check_seeding(sample: Callable, case: Case) -> None:
    logits = case.logits[None].expand(DRAWS, -1).contiguous()

    def draw(seed: int) -> torch.Tensor:
        title = f"{DRAWS} rows at temperature 1, with a generator seeded with {seed}"
        return call_sample(sample, logits, case.settings, torch.Generator().manual_seed(seed), title)

    first = draw(1)
    if not torch.equal(first, draw(1)):
        raise CheckFailed("sample: two generators seeded alike gave different tokens: it draws from torch's global "
                          f"random state (torch.rand, torch.multinomial without generator=...); {OWN_RANDOMNESS}")
    if torch.equal(first, draw(2)):
        raise CheckFailed("sample: generators seeded with 1 and with 2 gave the same tokens: the generator given is "
                          f"not used (a generator of your own, or a fixed seed?); {OWN_RANDOMNESS}")


def check_filters(sample: Callable) -> None:
    """min_p, top_k and top_p, each alone and together, by their draws' distribution."""
    cases = filter_cases()
    for seed, case in enumerate(cases):
        check_case(sample, case, seed)
    print(f"check_filters passed: {len(cases)} settings of min_p, top_k and top_p (off, boundaries, ties, after "
          f"the temperature, renormalized) draw as they should ({DRAWS} draws each, chi-square)")

