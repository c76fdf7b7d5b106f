"""SamplingParams validation and the sampler's filters, against hand-computed answers."""

from __future__ import annotations

import math

import pytest
import torch

from minillm import SamplingParams
from minillm.sample.sampler import Sampler, SamplingMetadata, apply_min_p, apply_top_k_top_p, sampling_probs

PROBS = [0.5, 0.25, 0.15, 0.1]  # no ties, so "which tokens survive" has one answer


def logits_of(probs) -> torch.Tensor:
    return torch.log(torch.tensor([probs], dtype=torch.float32))


def kept(filtered: torch.Tensor) -> set[int]:
    return set(torch.isfinite(filtered[0]).nonzero().flatten().tolist())


@pytest.mark.parametrize("top_p, expected", [
    (0.3, {0}),
    (0.5, {0}),  # exactly reached by the most likely token alone
    (0.75, {0, 1}),  # 0.5 + 0.25 reaches 0.75 exactly: the smallest set that reaches top_p
    (0.7501, {0, 1, 2}),
    (0.9, {0, 1, 2}),
    (0.95, {0, 1, 2, 3}),
    (1.0, {0, 1, 2, 3}),
    (math.ulp(0.0), {0}),  # the smallest top_p accepted: the most likely token always stays
])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, expected):
    assert kept(apply_top_k_top_p(logits_of(PROBS), None, torch.tensor([top_p]))) == expected


def test_top_p_boundary_is_not_decided_by_float_rounding():
    # 5/15 + 4/15 = 0.6 exactly, but float32's softmax-and-cumsum lands a hair on the wrong side;
    # the smallest set reaching 0.6 is still the two most likely tokens.
    probs = [5 / 15, 4 / 15, 1 / 15, 3 / 15, 2 / 15]
    assert kept(apply_top_k_top_p(logits_of(probs), None, torch.tensor([0.6]))) == {0, 1}


@pytest.mark.parametrize("top_k, expected", [(1, {0}), (2, {0, 1, 2}), (3, {0, 1, 2}), (4, {0, 1, 2, 3}),
                                             (0, {0, 1, 2, 3, 4}), (99, {0, 1, 2, 3, 4})])
def test_top_k_keeps_k_most_likely_and_ties_with_the_kth(top_k, expected):
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0, 0.0]])  # tokens 1 and 2 tie for second place
    assert kept(apply_top_k_top_p(logits, torch.tensor([top_k]), None)) == expected


def test_top_k_then_top_p_renormalises_between_filters():
    # top_k=2 leaves {0.5, 0.25} -> renormalised {2/3, 1/3}; top_p=0.6 then needs only token 0.
    assert kept(apply_top_k_top_p(logits_of(PROBS), torch.tensor([2]), torch.tensor([0.6]))) == {0}
    assert kept(apply_top_k_top_p(logits_of(PROBS), torch.tensor([2]), torch.tensor([0.7]))) == {0, 1}


def test_min_p_boundary_is_inclusive():
    half = torch.log(torch.tensor(0.5))
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0]]) + torch.tensor([[0.0, half, 2 * half, 3 * half]])
    # p1 = 0.5 * p_max exactly: kept with min_p=0.5; p2 = 0.25 * p_max: dropped.
    assert kept(apply_min_p(logits, torch.tensor([0.5]))) == {0, 1}
    assert kept(apply_min_p(logits, torch.tensor([0.25]))) == {0, 1, 2}
    assert kept(apply_min_p(logits, torch.tensor([0.0]))) == {0, 1, 2, 3}
    assert kept(apply_min_p(logits, torch.tensor([1.0]))) == {0}


def test_min_p_applies_before_top_p_which_renormalises_what_min_p_left():
    """vLLM's order. min_p=0.5 leaves {0.5, 0.25}, renormalised {2/3, 1/3}: top_p=0.6 then needs token 0
    alone. The other way round, top_p would keep two tokens (0.5 < 0.6) and min_p both of them."""
    meta = SamplingMetadata.from_seqs([_FakeSeq(SamplingParams(min_p=0.5, top_p=0.6))], torch.device("cpu"))
    probs = sampling_probs(logits_of(PROBS), meta)
    assert set((probs[0] > 0).nonzero().flatten().tolist()) == {0}


def sample_counts(params: SamplingParams, logits: torch.Tensor, n: int = 20000) -> torch.Tensor:
    seq = _FakeSeq(params, torch.Generator().manual_seed(123))
    sampler = Sampler(torch.Generator().manual_seed(0))
    meta = SamplingMetadata.from_seqs([seq] * n, torch.device("cpu"))
    tokens = sampler(logits.expand(n, -1).clone(), meta).token_ids
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1]).float() / n


class _FakeSeq:
    """The two things SamplingMetadata reads from a sequence."""

    def __init__(self, params: SamplingParams, generator=None, banned=()):
        self.params, self.generator, self._banned = params, generator, list(banned)

    def banned_token_ids(self, offset: int = 0):
        return self._banned


def test_sampling_frequencies_follow_the_filtered_distribution():
    freq = sample_counts(SamplingParams(temperature=1.0, top_p=0.75), logits_of(PROBS))
    torch.testing.assert_close(freq, torch.tensor([2 / 3, 1 / 3, 0, 0]), atol=0.015, rtol=0)


def test_temperature_applies_before_min_p():
    # T=2 turns p into sqrt(p) (renormalised): relative to the max, [1, .71, .55, .45]; min_p=0.5
    # then keeps three tokens, where without temperature it would keep two.
    freq = sample_counts(SamplingParams(temperature=2.0, min_p=0.5), logits_of(PROBS))
    expected = torch.tensor(PROBS[:3]).sqrt()
    torch.testing.assert_close(freq, torch.cat([expected / expected.sum(), torch.zeros(1)]), atol=0.015, rtol=0)


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch():
    logits = torch.randn(1, 50)
    params = SamplingParams(temperature=1.0, seed=7)

    def run(batch_params):
        seqs = [_FakeSeq(p, torch.Generator().manual_seed(p.seed) if p.seed is not None else None)
                for p in batch_params]
        sampler = Sampler(torch.Generator().manual_seed(0))
        return [sampler(logits.expand(len(seqs), -1).clone(), SamplingMetadata.from_seqs(seqs, torch.device("cpu")))
                .token_ids[batch_params.index(params)] for _ in range(20)]

    alone = run([params])
    assert run([SamplingParams(temperature=0.5), params, SamplingParams(top_k=3, seed=1)]) == alone
    assert len(set(alone)) > 1  # it really is sampling


def test_greedy_rows_take_the_argmax_in_a_mixed_batch_and_bans_apply():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    seqs = [_FakeSeq(SamplingParams(temperature=0.0)), _FakeSeq(SamplingParams(temperature=0.0), banned=[1])]
    meta = SamplingMetadata.from_seqs(seqs, torch.device("cpu"))
    out = Sampler(torch.Generator().manual_seed(0))(logits.clone(), meta)
    assert out.token_ids == [1, 2]


def test_a_greedy_row_beside_sampling_ones_takes_the_first_argmax_even_on_a_tie():
    """Greedy is the argmax, deterministic whatever the seed; it must not draw between tied tokens as
    the sampling rows of its batch draw."""
    logits = torch.tensor([[0.0, 4.0, 4.0, 1.0]] * 2)
    seqs = [_FakeSeq(SamplingParams(temperature=0.0)), _FakeSeq(SamplingParams(temperature=1.0))]
    meta = SamplingMetadata.from_seqs(seqs, torch.device("cpu"))
    assert not meta.all_greedy
    for seed in range(20):
        assert Sampler(torch.Generator().manual_seed(seed))(logits.clone(), meta).token_ids[0] == 1


def test_logprobs_are_raw_with_ranks():
    logits = logits_of(PROBS)
    seqs = [_FakeSeq(SamplingParams(temperature=0.0, logprobs=2))]
    out = Sampler(torch.Generator())(logits.clone(), SamplingMetadata.from_seqs(seqs, torch.device("cpu")))
    assert out.token_ids == [0] and out.sampled_ranks == [1]
    assert out.top_token_ids == [[0, 1]]
    assert out.top_logprobs[0] == pytest.approx([math.log(0.5), math.log(0.25)], abs=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), r"temperature must be finite and in \[0, "),
    (dict(temperature=math.nan), "temperature must be finite"),
    (dict(temperature=math.inf), "temperature must be finite"),
    (dict(temperature=10**400), "temperature must be finite"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_p=math.nan), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), r"top_k must be 0 or -1 \(disabled\) or in \[1, 2147483647\]"),
    (dict(top_k=2**63), r"top_k must be 0 or -1 \(disabled\) or in \[1, 2147483647\]"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
    (dict(min_p=-math.inf), r"min_p must be in \[0, 1\]"),
    (dict(max_tokens=0), r"max_tokens must be in \[1, 2147483647\]"),
    (dict(max_tokens=2**63), r"max_tokens must be in \[1, 2147483647\]"),
    (dict(min_tokens=-1), r"min_tokens must be in \[0, 2147483647\]"),
    (dict(min_tokens=2**31, max_tokens=None), r"min_tokens must be in \[0, 2147483647\]"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens must be <= max_tokens=4"),
    (dict(seed=2**64), r"seed must be in \[-9223372036854775808, 18446744073709551615\]"),
    (dict(seed=-(2**63) - 1), r"seed must be in \[-9223372036854775808, 18446744073709551615\]"),
    (dict(logprobs=-1), r"logprobs must be in \[0, 20\]"),
    (dict(logprobs=21), r"logprobs must be in \[0, 20\]"),
    (dict(stop=[""]), "stop must be a non-empty string"),
    (dict(stop_token_ids=[-1]), r"stop_token_ids must be token ids in \[0, 2147483647\]"),
    (dict(stop_token_ids=[2**63]), r"stop_token_ids must be token ids in \[0, 2147483647\]"),
    (dict(stop_token_ids=[True]), r"stop_token_ids must be token ids in \[0, 2147483647\]"),
    (dict(stop=["x"] * 1025), "stop must have at most 1024 entries, got 1025"),
    (dict(stop_token_ids=list(range(1025))), "stop_token_ids must have at most 1024 entries, got 1025"),
    (dict(presence_penalty=2.5), r"presence_penalty must be in \[-2.0, 2.0\]"),
    (dict(frequency_penalty=-2.5), r"frequency_penalty must be in \[-2.0, 2.0\]"),
    (dict(repetition_penalty=0), r"repetition_penalty must be in \[0.01, 100.0\]"),
    (dict(repetition_penalty=101), r"repetition_penalty must be in \[0.01, 100.0\]"),
])
def test_bad_sampling_params_name_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0), dict(temperature=3.4028234663852886e38), dict(top_p=1), dict(top_p=math.ulp(0.0)),
    dict(min_p=0), dict(min_p=1), dict(top_k=-1), dict(top_k=0), dict(top_k=1), dict(top_k=2**31 - 1),
    dict(max_tokens=1), dict(max_tokens=2**31 - 1), dict(min_tokens=4, max_tokens=4),
    dict(min_tokens=2**31 - 1, max_tokens=None), dict(seed=-(2**63)), dict(seed=2**64 - 1),
    dict(logprobs=0), dict(logprobs=20), dict(prompt_logprobs=20), dict(presence_penalty=-2),
    dict(frequency_penalty=2), dict(repetition_penalty=0.01), dict(repetition_penalty=100),
    dict(stop=["x"] * 1024), dict(stop_token_ids=list(range(1024))), dict(stop_token_ids=[2**31 - 1]),
], ids=repr)
def test_the_bounds_themselves_are_accepted(kwargs):
    """Each range is closed where its message says so: the values at its ends are requests like any other."""
    SamplingParams(**kwargs)


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="max_tokens must be an integer"):
        SamplingParams(max_tokens="16")
    with pytest.raises(TypeError, match="temperature must be a number"):
        SamplingParams(temperature=None)
    with pytest.raises(TypeError, match="seed must be an integer"):
        SamplingParams(seed=1.5)
    # A bool is an int to Python, never a number of a request's.
    with pytest.raises(TypeError, match="top_p must be a number, got bool"):
        SamplingParams(top_p=True)
    with pytest.raises(TypeError, match="max_tokens must be an integer, got bool"):
        SamplingParams(max_tokens=True)
    with pytest.raises(TypeError, match="stop_token_ids must be a list, got int"):
        SamplingParams(stop_token_ids=5)
    with pytest.raises(TypeError, match="stop must be a list, got int"):
        SamplingParams(stop=5)
    for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
        with pytest.raises(TypeError, match=f"{name} must be a bool, got str"):
            SamplingParams(**{name: "no"})  # truthy: it would have switched the behaviour on
    with pytest.raises(TypeError, match="output_kind must be a RequestOutputKind"):
        SamplingParams(output_kind="x")


def test_fields_set_after_construction_are_checked_again_by_the_engine():
    params = SamplingParams(max_tokens=3)
    params.temperature = math.nan
    with pytest.raises(ValueError, match="temperature must be finite"):
        params.verify()
    params = SamplingParams(max_tokens=3)
    params.stop_token_ids = None  # normalized again, as at construction
    params.verify()
    assert params.stop_token_ids == []


def test_the_largest_accepted_values_sample():
    params = SamplingParams(top_k=2**31 - 1, seed=2**64 - 1, max_tokens=2**31 - 1, min_tokens=2**31 - 1,
                            logprobs=20, temperature=3e38, stop_token_ids=[2**31 - 1])
    seq = _FakeSeq(params, torch.Generator().manual_seed(params.seed), banned=params.stop_token_ids)
    out = Sampler(torch.Generator())(torch.randn(1, 50), SamplingMetadata.from_seqs([seq], torch.device("cpu")))
    assert out.token_ids[0] in range(50) and len(out.top_token_ids[0]) == 20


def test_greedy_switches_filters_off_and_minus_one_top_k_means_off():
    assert (SamplingParams(temperature=0, top_p=0.5, top_k=3, min_p=0.2).top_p,
            SamplingParams(temperature=0, top_k=3).top_k) == (1.0, 0)
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="\n").stop_strings == ["\n"]
