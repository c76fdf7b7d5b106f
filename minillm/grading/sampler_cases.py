"""How exercise 00's checks run the learner's `sample(logits, temperature, top_k, top_p, min_p, generator)`:
every call validated (a long tensor of token ids, one per row, on the logits' device, the logits left
as they were), and the distribution test. A case is one row of logits and one setting, drawn DRAWS
times from a seeded generator; the tokens drawn are tested against the engine's exact distribution
(sampling_probs) with a chi-square test. The usual mistakes draw from distributions of their own,
written beside each case, so that draws that fail the test and fit a mistake's distribution are
told which mistake they fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from minillm.grading.feedback import CheckFailed, call_learner, shape
from minillm.sample.sampler import SamplingMetadata, sampling_probs
from minillm.spec_decode.chi_square import chi_square

# 4,000 draws put each of the cases' mistakes dozens of standard errors away from the right
# distribution; a right sampler passes each case at MIN_P_VALUE, and with the fixed seeds below it
# passes every time.
DRAWS = 4_000
MIN_P_VALUE = 1e-5

RULES = ("temperature 0: each row's argmax; otherwise divide the logits by the temperature, then drop "
         "tokens by min_p (p < min_p * p_max), then top_k (tokens below the k-th largest), then top_p (past the "
         "smallest most likely set holding top_p of what is left), softmax what remains, and draw "
         "argmax(probs / noise) with noise = torch.empty_like(probs).exponential_(generator=generator)")
OWN_RANDOMNESS = ("draw every random number from the generator given (exponential_(generator=generator)): "
                  "a request's seed makes its generator, and the seed must decide its tokens")


@dataclasses.dataclass(frozen=True)
class Settings:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __str__(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name):g}" for f in dataclasses.fields(self))


@dataclasses.dataclass(frozen=True)
class Case:
    """A row of logits and a setting; what the usual mistakes draw from instead, and why."""

    title: str
    logits: torch.Tensor  # [V]
    settings: Settings
    mistakes: tuple[tuple[torch.Tensor, str], ...] = ()


def normalized(weights: torch.Tensor) -> torch.Tensor:
    return weights / weights.sum()


def kept(probs: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """probs renormalized over tokens, 0 elsewhere: what a filter that keeps those tokens samples."""
    mask = torch.zeros_like(probs, dtype=torch.bool)
    mask[tokens] = True
    return normalized(torch.where(mask, probs, 0))


def exact_probs(logits: torch.Tensor, settings: Settings) -> torch.Tensor:
    """The engine's distribution for one row of logits [V] under settings: [V] float64."""
    meta = SamplingMetadata(
        temperature=torch.tensor([settings.temperature]), top_k=torch.tensor([settings.top_k]),
        top_p=torch.tensor([settings.top_p]), min_p=torch.tensor([settings.min_p]), generators=[None],
        banned_token_ids=[[]], num_logprobs=[None], all_greedy=False)
    return sampling_probs(logits[None].float(), meta)[0].double()


def call_sample(sample: Callable, logits: torch.Tensor, settings: Settings, generator: torch.Generator,
                case: str) -> torch.Tensor:
    """The learner's sample on a copy of logits [B, V]: its tokens, validated, [B] long."""
    copy = logits.clone()
    out = call_learner(sample, "sample", case, copy, settings.temperature, settings.top_k, settings.top_p,
                       settings.min_p, generator)
    return validate(out, logits, case, logits_after=copy)


def validate(out: object, logits: torch.Tensor, case: str, logits_after: torch.Tensor | None = None) -> torch.Tensor:
    rows, vocab = logits.shape
    want = f"a tensor of shape [{rows}] (one token id per row of logits) of torch.long"
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(f"sample returned {type(out).__name__}; expected {want}\n  on input: {case}")
    if tuple(out.shape) != (rows,):
        raise CheckFailed(f"sample returned shape {shape(out)}; expected {want} (argmax(dim=-1) keeps one per "
                          f"row)\n  on input: {case}")
    if out.dtype != torch.long:
        raise CheckFailed(f"sample returned dtype {out.dtype}; expected torch.long, as argmax returns\n"
                          f"  on input: {case}")
    if out.device != logits.device:
        raise CheckFailed(f"sample returned a tensor on {out.device}, the logits are on {logits.device}: create "
                          f"new tensors on the logits' device (torch.empty_like(probs) does)\n  on input: {case}")
    if ((out < 0) | (out >= vocab)).any():
        raise CheckFailed(f"sample returned a token id outside 0..{vocab - 1}, for a vocabulary of {vocab}\n"
                          f"  on input: {case}")
    if logits_after is not None and not torch.equal(logits, logits_after):
        raise CheckFailed(f"sample changed its input logits in place: the engine reads them again afterwards "
                          f"(logits / temperature makes a new tensor; logits /= temperature does not)\n"
                          f"  on input: {case}")
    return out


def describe(case: Case) -> str:
    values = [round(v, 3) for v in case.logits.tolist()]
    return f"{case.title}\n    logits: {values}\n    {case.settings}"


def check_case(sample: Callable, case: Case, seed: int) -> None:
    """DRAWS rows of case.logits sampled in one call, with a generator seeded with seed; their tokens
    tested against the engine's distribution."""
    logits = case.logits[None].expand(DRAWS, -1).contiguous()
    title = f"{case.title} ({DRAWS} rows of the same logits, {case.settings})"
    tokens = call_sample(sample, logits, case.settings, torch.Generator().manual_seed(seed), title)
    counts = torch.bincount(tokens, minlength=len(case.logits))
    expected = exact_probs(case.logits, case.settings)
    if chi_square(counts, expected)[2] >= MIN_P_VALUE:
        return
    drawn = counts.double() / DRAWS
    fit, hint = max(((chi_square(counts, dist)[2], why) for dist, why in case.mistakes), default=(0.0, RULES))
    if fit < MIN_P_VALUE:
        hint = (f"every row drew token {counts.argmax().item()}: each row is a draw of its own, with noise for "
                "every row and token (the shape of probs), and it is a draw, not the most likely token"
                if (counts == DRAWS).any() else RULES)
    raise CheckFailed(f"sample: the tokens drawn are not distributed as they should be, on: {describe(case)}\n"
                      f"  expected: {_fmt(expected)}\n  drawn:    {_fmt(drawn)}  ({DRAWS} draws)\n"
                      f"  hint: {hint}")


def _fmt(probs: torch.Tensor) -> str:
    return "[" + ", ".join(f"{p:.3f}" for p in probs.tolist()) + "]"
