"""The rejection sampler on exact small-vocabulary distributions: greedy keeps the prefix the
target's argmax agrees with; sampling emits, at every position, tokens distributed as the target's
p, whatever the draft's q (chi-square, fixed seeds), and the tempting wrong rules fail that test."""

from __future__ import annotations

import math

import pytest
import torch

from minillm.sample.rejection_sampler import PAD, greedy_accept, stochastic_accept
from minillm.spec_decode.chi_square import chi_square

V, K, N = 6, 3, 40_000


def test_greedy_keeps_the_agreeing_prefix_then_the_targets_token():
    target = torch.tensor([[5, 2, 7, 1], [5, 2, 7, 1], [5, 2, 7, 1], [4, 4, 4, 4]])
    drafts = torch.tensor([[5, 2, 7], [5, 3, 7], [9, 2, 7], [4, 4, PAD]])
    out = greedy_accept(target, drafts, torch.tensor([3, 3, 3, 2]))
    assert out.tolist() == [[5, 2, 7, 1],  # all kept, then the bonus
                            [5, 2, PAD, PAD],  # kept 5, rejected 3: the target's 2, and nothing judged after
                            [5, PAD, PAD, PAD],  # a later match after a rejection counts for nothing
                            [4, 4, 4, PAD]]  # two real drafts kept, the bonus at position 2


def test_no_drafts_is_plain_sampling():
    assert greedy_accept(torch.tensor([[3]]), torch.zeros(1, 0, dtype=torch.long), torch.tensor([0])).tolist() == [[3]]


def test_chi_square_worked_out_by_hand():
    """The test every lossless check rests on, against values computed by hand: with 3 bins (2 degrees
    of freedom) the p-value is exp(-statistic / 2); bins expected to hold fewer than 5 samples are
    pooled into one; a token that cannot occur, drawn, fails outright."""
    statistic, dof, p_value = chi_square(torch.tensor([10, 20, 30]), torch.tensor([1.0, 1.0, 1.0]))
    assert (statistic, dof) == (pytest.approx(10.0), 2) and p_value == pytest.approx(math.exp(-5.0))
    # 100 samples: expected 60, 38, then 1 and 1 pooled into one bin of 2 (observed 3 + 2 = 5).
    statistic, dof, p_value = chi_square(torch.tensor([55, 40, 3, 2]), torch.tensor([0.6, 0.38, 0.01, 0.01]))
    expected = 5**2 / 60 + 2**2 / 38 + 3**2 / 2
    assert (statistic, dof) == (pytest.approx(expected), 2) and p_value == pytest.approx(math.exp(-expected / 2))
    assert chi_square(torch.tensor([9, 1]), torch.tensor([1.0, 0.0]))[2] == 0.0


def distributions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p [K + 1, V] and q [K, V], random, with zeros in each (tokens one side can never produce)."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.rand(K + 1, V, generator=gen) ** 3
    q = torch.rand(K, V, generator=gen) ** 3
    p[:, 0] = 0  # the draft may propose token 0, which the target never produces
    q[:, 1] = 0  # the target produces token 1, which the draft never proposes
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def simulate(accept, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """N independent verifications of K drafts drawn from q: their emitted tokens, p, and the drafts."""
    p, q = distributions(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    drafts = torch.stack([torch.multinomial(q[j], N, replacement=True, generator=gen) for j in range(K)], dim=1)
    out = accept(p.expand(N, -1, -1), q.expand(N, -1, -1), drafts, torch.full((N,), K),
                 torch.rand(N, K, generator=gen), torch.empty(N, V).exponential_(generator=gen))
    return out, p, drafts


def position_p_values(out: torch.Tensor, p: torch.Tensor) -> list[float]:
    """For each position j, the p-value of the tokens emitted there (by runs that reached it)
    against p_j: a run reaches position j when its first j drafts were kept."""
    values = []
    for j in range(K + 1):
        reached = (out[:, :j] != PAD).all(dim=1) & (out[:, j] != PAD)
        values.append(chi_square(torch.bincount(out[reached, j], minlength=V), p[j])[2])
    return values


def test_every_position_follows_the_target_distribution():
    out, p, _ = simulate(stochastic_accept)
    assert min(position_p_values(out, p)) > 1e-3
    assert (out[:, 0] != 0).all()  # p(0) = 0: never emitted, though often drafted


def keeps_the_bonus(accept) -> bool:
    """A run whose first K tokens are the K drafts must go on with a bonus token. (A rejected draft
    is never the recovered token: rejection needs p(x) < q(x), where the residual is 0.)"""
    out, _, drafts = simulate(accept)
    all_drafts = (out[:, :K] == drafts).all(dim=1)
    return bool(all_drafts.any()) and bool((out[all_drafts, K] != PAD).all())


def bonus_dropped(p, q, drafts, num, u, noise):
    out = stochastic_accept(p, q, drafts, num, u, noise)
    return torch.where((out[:, :-1] != PAD).all(dim=1, keepdim=True), torch.cat(
        [out[:, :-1], torch.full_like(out[:, :1], PAD)], dim=1), out)


def test_a_dropped_bonus_token_is_caught():
    assert keeps_the_bonus(stochastic_accept)
    assert not keeps_the_bonus(bonus_dropped)


def accept_always(p, q, drafts, num, u, noise):
    return stochastic_accept(p, q, drafts, num, torch.zeros_like(u) - 1, noise)


def resample_from_p(p, q, drafts, num, u, noise):
    """The tempting wrong rule: accept as the right one does, but after a rejection draw from p
    itself instead of the residual max(0, p - q)."""
    k = drafts.shape[1]
    x = drafts.clamp(min=0)[..., None]
    rows = torch.arange(len(drafts), device=drafts.device)  # the engine's device (on a GPU, CUDA)
    real = torch.arange(k, device=drafts.device) < num[:, None]
    kept = ((u * q.gather(2, x)[..., 0] < p[:, :k].gather(2, x)[..., 0]) & real).cumprod(dim=1).bool()
    stop = kept.sum(dim=1)
    out = torch.full((len(drafts), k + 1), PAD, device=drafts.device)
    out[:, :k] = torch.where(kept, drafts, PAD)
    out[rows, stop] = (p[rows, stop] / noise).argmax(dim=1)
    return out


def bonus_off_by_one(p, q, drafts, num, u, noise):
    """The bonus drawn from the last draft's p instead of the position after it."""
    return stochastic_accept(torch.cat([p[:, :-1], p[:, -2:-1]], dim=1), q, drafts, num, u, noise)


def ignore_q(p, q, drafts, num, u, noise):
    """Accept with probability p(x), as if q were uniform over one token."""
    return stochastic_accept(p, torch.ones_like(q), drafts, num, u, noise)


@pytest.mark.parametrize("broken", [accept_always, resample_from_p, bonus_off_by_one, ignore_q])
def test_wrong_rules_fail_the_same_test(broken):
    out, p, _ = simulate(broken)
    assert min(position_p_values(out, p)) < 1e-6, broken.__doc__
