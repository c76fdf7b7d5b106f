"""Pearson's chi-square test of sampled tokens against an exact distribution: the check that a
sampler is lossless. Bins expected to hold fewer than 5 samples are pooled into one, as the
test's approximation asks."""

from __future__ import annotations

import torch


def chi_square(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int, float]:
    """counts [V] of sampled tokens, probs [V] the distribution they should follow -> (statistic,
    degrees of freedom, p-value). A p-value below 1e-3 says the sampler is not drawing from probs."""
    counts, probs = counts.double(), probs.double() / probs.sum()
    n = counts.sum()
    expected = probs * n
    if (counts[expected == 0] > 0).any():
        return float("inf"), 1, 0.0  # a token that cannot occur did
    big = expected >= min_expected
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = len(expected) - 1
    return float(statistic), dof, p_value(float(statistic), dof)


def p_value(statistic: float, dof: int) -> float:
    """The chance of a statistic at least this large from a chi-square with dof degrees of freedom
    (statistics and dofs of independent tests add up)."""
    if dof < 1:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.double),
                                         torch.tensor(statistic / 2, dtype=torch.double)))
