"""Exercise 00's checks: they pass the solution, the engine's own sampler and a sampler that draws the
right distribution another way; each usual mistake fails, named; every mistake's distribution is far
enough from the right one to fail at the checks' number of draws, and near enough to its own to be
named; and the engine check passes the solution, names a draw that is not the engine's, and leaves the
engine's sampler in place."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from minillm import LLM
from minillm.grading.checks_sampler import check_filters, check_temperature, filter_cases, temperature_cases
from minillm.grading.checks_sampler_engine import check_engine
from minillm.grading.feedback import CheckFailed
from minillm.grading.notebook import is_solution, read
from minillm.grading.sampler_cases import DRAWS, MIN_P_VALUE, exact_probs
from minillm.sample.sampler import Sampler, SamplingMetadata
from minillm.spec_decode.chi_square import chi_square

REPO = Path(__file__).resolve().parents[2]
SOLUTION = REPO / "solutions" / "00_welcome.ipynb"


@pytest.fixture(scope="module")
def solution_sample() -> Callable:
    """The solution notebook's `sample`, run with the modules its notebook imports."""
    [cell] = [c for c in read(SOLUTION).cells if c.cell_type == "code" and is_solution(c)]
    namespace = {"math": math, "torch": torch}
    exec(cell.source, namespace)
    return namespace["sample"]


def engine_sample(logits, temperature, top_k, top_p, min_p, generator):
    """The engine's Sampler as a learner's `sample`: every row drawn from the one generator given."""
    rows = len(logits)
    meta = SamplingMetadata(temperature=torch.full((rows,), float(temperature)),
                            top_k=torch.full((rows,), top_k), top_p=torch.full((rows,), float(top_p)),
                            min_p=torch.full((rows,), float(min_p)), generators=[None] * rows,
                            banned_token_ids=[[] for _ in range(rows)], num_logprobs=[None] * rows,
                            all_greedy=temperature == 0)
    return torch.tensor(Sampler(generator)(logits.clone(), meta).token_ids)


def sample_with(temperature="divide", greedy=True, min_p="relative", top_k="ties", top_p="right",
                draw="race", rng="given", softmax="stable"):
    """The rules written out, with one of them broken by an argument."""
    def softmax_of(x):
        if softmax == "stable":
            return x.softmax(dim=-1)
        e = x.exp()  # without subtracting the row's max first
        return e / e.sum(dim=-1, keepdim=True)

    def sample(logits, t, k, p, m, generator):
        if t == 0 and greedy:
            return logits.argmax(dim=-1)
        x = {"divide": lambda: logits / t, "multiply": lambda: logits * t,
             "after softmax": lambda: (logits.softmax(-1) / t).log(),
             "softmax twice": lambda: logits.softmax(-1) / t}[temperature]()
        tempered = x
        if m > 0:
            probs = softmax_of(logits if min_p == "before temperature" else x)
            threshold = m if min_p == "absolute" else m * probs.amax(dim=-1, keepdim=True)
            x = x.masked_fill(probs < threshold, -math.inf)
        if k != 0 and (top_k == "crash at -1" or 0 < k < x.shape[-1]):
            kk = k + {"minus one": -1, "plus one": 1}.get(top_k, 0)
            values, indices = x.topk(kk, dim=-1)
            if top_k == "exactly k":
                x = torch.full_like(x, -math.inf).scatter(-1, indices, values)
            else:
                x = x.masked_fill(x < values[:, -1:], -math.inf)
        if p < 1 or top_p == "drops the last at 1":
            probs, order = softmax_of(tempered if top_p == "not renormalized" else x).sort(-1, descending=True)
            cumulative = probs.cumsum(dim=-1)
            before = cumulative - probs
            last = (torch.arange(probs.shape[-1]) == probs.shape[-1] - 1).expand_as(before)
            drop = {"right": before >= p, "not renormalized": before >= p, "one too few": cumulative > p,
                    "one too many": torch.cat([torch.zeros_like(before[:, :1]), before[:, :-1]], dim=-1) >= p,
                    "drops the last at 1": last}[top_p]
            x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -math.inf)
        probs = softmax_of(x)
        if draw == "multinomial":
            return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        if draw == "inverse cdf":  # right in distribution, but not the engine's tokens for a seed
            u = torch.rand(len(probs), 1, generator=generator)
            return (probs.cumsum(dim=-1) < u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)
        if draw == "argmax":
            return probs.argmax(dim=-1)
        shape = probs.shape if draw == "race" else (1, probs.shape[-1])
        gen = {"given": generator, "global": None, "own": torch.Generator().manual_seed(0)}[rng]
        return (probs / torch.empty(shape).exponential_(generator=gen)).argmax(dim=-1)
    return sample


def in_place(logits, t, k, p, m, generator):
    logits.div_(max(t, 1e-5))
    return sample_with()(logits, 1.0, k, p, m, generator)


def not_implemented(*args):
    raise NotImplementedError()


def test_checks_pass_the_solution_the_engines_sampler_and_another_right_draw(solution_sample, capsys):
    samplers = (solution_sample, engine_sample, sample_with(), sample_with(draw="multinomial"),
                sample_with(draw="inverse cdf"))
    for sample in samplers:
        check_temperature(sample)
        check_filters(sample)
    out = capsys.readouterr().out
    assert out.count("check_temperature passed") == out.count("check_filters passed") == len(samplers)


@pytest.mark.parametrize("wrong, message", [
    (sample_with(temperature="multiply"), "multiplied the logits by the temperature"),
    (sample_with(temperature="after softmax"), "applied the temperature after the softmax"),
    (sample_with(temperature="softmax twice"), "applied the temperature after the softmax"),
    (sample_with(greedy=False), "temperature 0 means greedy"),
    (sample_with(draw="argmax"), "every row drew token 0: each row is a draw of its own"),
    (sample_with(draw="one noise for all rows"), "every row drew token"),
    (sample_with(rng="global"), "draws from torch's global random state"),
    (sample_with(softmax="overflows"), "the softmax overflowed: exp of a logit above 88 is inf"),
    (sample_with(softmax="overflows", draw="multinomial"), r"raised RuntimeError(?s:.*)as large as a model's"),
    (sample_with(rng="own"), "the generator given is not used"),
    (sample_with(top_k="crash at -1"), r"raised RuntimeError(?s:.*)top_k = -1 keeps every token"),
    (sample_with(top_p="drops the last at 1"), "least likely token never came out: top_p = 1 must keep"),
    (sample_with(top_k="minus one"), "one token too few: keep the k largest logits"),
    (sample_with(top_k="plus one"), "one token too many: keep the k largest logits"),
    (sample_with(top_k="exactly k"), "tokens tied with the k-th largest logit stay too"),
    (sample_with(top_p="one too few"), "one token too few: top_p keeps the smallest set"),
    (sample_with(top_p="one too many"), "one token too many: top_p keeps the smallest set"),
    (sample_with(min_p="absolute"), "min_p is relative to the most likely token"),
    (sample_with(min_p="before temperature"), "min_p applies after the temperature"),
    (sample_with(top_p="not renormalized"), "top_p measures what min_p and top_k left, renormalized"),
    (in_place, "changed its input logits in place"),
    (lambda *args: sample_with()(*args).int(), "dtype torch.int32; expected torch.long"),
    (lambda *args: sample_with()(*args)[:, None], r"shape \[16, 1\]; expected a tensor of shape \[16\]"),
    (lambda *args: sample_with()(*args).tolist(), "returned list"),
    (not_implemented, "sample is not implemented yet"),
], ids=["temperature-multiplied", "temperature-after-softmax", "softmax-twice", "greedy-divides-by-zero",
        "argmax-not-a-draw", "one-noise-for-all-rows", "global-rng", "softmax-overflows",
        "softmax-overflows-multinomial", "own-generator", "top-k-minus-one-crashes",
        "top-p-1-drops-a-token", "top-k-one-too-few", "top-k-one-too-many", "top-k-drops-ties",
        "top-p-one-too-few", "top-p-one-too-many", "min-p-absolute", "min-p-before-temperature",
        "top-p-not-renormalized", "in-place", "int32", "keepdim", "list", "not-implemented"])
def test_each_mistake_is_named(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_temperature(wrong)
        check_filters(wrong)


def test_the_cases_keep_the_tokens_their_titles_say():
    support = {case.title: (exact_probs(case.logits, case.settings) > 0).nonzero().flatten().tolist()
               for case in filter_cases()}
    six = list(range(6))
    assert list(support.values()) == [six, six, six, six, [0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 2, 3],
                                      [0, 1], [0, 1, 2]]


@pytest.mark.parametrize("case", temperature_cases() + filter_cases(), ids=lambda c: c.title[:40])
def test_mistakes_fail_and_are_named_and_the_right_distribution_passes_at_every_seed(case):
    """Draws straight from each distribution, for 20 seeds: the right one always passes, each mistake's
    always fails against the right one and always fits its own."""
    expected = exact_probs(case.logits, case.settings)
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        right = torch.multinomial(expected, DRAWS, replacement=True, generator=gen).bincount(minlength=len(expected))
        assert chi_square(right, expected)[2] >= MIN_P_VALUE
        for dist, why in case.mistakes:
            counts = torch.multinomial(dist, DRAWS, replacement=True, generator=gen).bincount(minlength=len(dist))
            assert chi_square(counts, expected)[2] < MIN_P_VALUE, why
            assert chi_square(counts, dist)[2] >= MIN_P_VALUE, why


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", device="cpu", dtype="float32", max_model_len=128)


def test_engine_check_passes_the_solution_and_leaves_the_engines_sampler(solution_sample, llm, capsys):
    sampler = llm.llm_engine.model_runner.sampler
    check_engine(solution_sample, llm)
    assert "check_engine passed" in capsys.readouterr().out
    assert llm.llm_engine.model_runner.sampler is sampler


@pytest.mark.parametrize("wrong, message", [
    (sample_with(draw="inverse cdf"), "the engine draws with the exponential race"),
    (sample_with(greedy=False), r"temperature=0, .*\n(?s:.*)temperature 0 is greedy"),
    (not_implemented, "sample is not implemented yet"),
    (lambda *args: sample_with()(*args)[:, None], r"shape \[1, 1\](?s:.*)on input: a call from the engine"),
], ids=["another-draw", "greedy-divides-by-zero", "not-implemented", "keepdim"])
def test_engine_check_names_what_differs(llm, wrong, message):
    sampler = llm.llm_engine.model_runner.sampler
    with pytest.raises(CheckFailed, match=message):
        check_engine(wrong, llm)
    assert llm.llm_engine.model_runner.sampler is sampler
