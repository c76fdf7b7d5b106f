"""Acceptance of speculative decoding: how many drafts the target kept, Leviathan et al.'s alpha,
and tokens per target call measured against the formula. The engine counts every verification
(`LLM.get_metrics()`); a trace gives the same numbers for a run (the DraftAcceptance widget,
`minillm bench spec`, chapter 05)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypedDict

from minillm.engine.trace import SeqState, Trace


class AcceptanceStats(TypedDict):
    drafts: int  # proposals verified: one per sequence and step that speculated
    draft_tokens: int  # tokens proposed
    accepted_tokens: int
    judged_tokens: int  # positions the target decided on: up to and including the first rejection
    alpha: float | None  # accepted / judged; None before the first draft
    acceptance_rate: float | None  # vLLM's accepted / proposed, for comparison
    tokens_per_target_call: float | None  # (accepted + one target token per verify) / verifies
    expected_tokens_per_target_call: float | None  # the formula at alpha, for the proposals' lengths
    accepted_per_position: list[int]  # proposals whose i-th draft token was accepted
    judged_per_position: list[int]  # proposals whose i-th draft token the target judged (reached)
    proposal_lengths: dict[int, int]  # draft tokens a proposal held -> proposals that held that many


@dataclass
class AcceptanceCounts:
    """Running totals over verified proposals."""

    k: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(init=False)  # accepted at each position
    judged_per_position: list[int] = field(init=False)  # reached at each position: all before it accepted
    lengths: dict[int, int] = field(default_factory=dict)  # proposal length -> proposals of that length

    def __post_init__(self) -> None:
        self.per_position = [0] * self.k
        self.judged_per_position = [0] * self.k

    def add(self, proposed: int, accepted: int) -> None:
        """A proposal of `proposed` draft tokens, of which the target kept the first `accepted`."""
        self.drafts += 1
        self.lengths[proposed] = self.lengths.get(proposed, 0) + 1
        self.draft_tokens += proposed
        self.accepted += accepted
        longer = proposed - len(self.per_position)  # a proposal longer than k: not expected
        self.per_position += [0] * longer
        self.judged_per_position += [0] * longer
        for i in range(accepted):
            self.per_position[i] += 1
        for i in range(min(accepted + 1, proposed)):
            self.judged_per_position[i] += 1

    @property
    def judged(self) -> int:
        """Draft tokens the target decided on: each proposal's up to and including its first rejection."""
        return sum(self.judged_per_position)

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.judged if self.judged else None

    @property
    def tokens_per_call(self) -> float | None:
        return (self.accepted + self.drafts) / self.drafts if self.drafts else None

    @property
    def expected_tokens_per_call(self) -> float | None:
        """The formula at the measured alpha, for the proposals' own lengths: a proposal shorter than
        k (prompt lookup found fewer tokens, or max_tokens was near) can yield no more than it holds."""
        alpha = self.alpha
        if alpha is None:
            return None
        return sum(n * expected_tokens_per_call(alpha, length) for length, n in self.lengths.items()) / self.drafts


def expected_tokens_per_call(alpha: float, k: int) -> float:
    """Leviathan et al. (2023), eq. 1: the expected tokens one target call yields when each draft
    token is accepted with probability alpha, independently: (1 - alpha^(k+1)) / (1 - alpha)."""
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def position_rates(stats: AcceptanceStats) -> list[float]:
    """The chance that the target accepts the i-th draft token once it reaches it (all before it
    accepted), position by position: accepted / judged at each position, as far as any proposal
    reached. alpha pools them into one rate, and the formula built on it miscounts, either way,
    wherever the chance depends on the position: drafts right or wrong whole (it overcounts), or a
    repetitive text whose one hard token falls at the same place of every draft (it undercounts)."""
    return [a / j for a, j in zip(stats["accepted_per_position"], stats["judged_per_position"]) if j]


def expected_tokens_from_rates(rates: list[float], k: int) -> float:
    """Tokens one target call yields with k draft tokens when position i is accepted at rates[i]
    once reached: 1 + r1 + r1 r2 + ... + r1 ... rk, positions past the measured ones at the last
    measured rate. With one rate alpha everywhere, the formula of `expected_tokens_per_call`."""
    if not rates:
        raise ValueError("rates: need the rate of at least one position")
    tokens, reached = 1.0, 1.0
    for i in range(k):
        reached *= rates[min(i, len(rates) - 1)]
        tokens += reached
    return tokens


def modelled_tokens_per_call(stats: AcceptanceStats, rates: list[float]) -> float | None:
    """Tokens per call of a run's own proposals, each of its own length, at the positions' `rates`
    (those of this run, or of a run with longer drafts); None without rates or proposals."""
    if not rates or not stats["drafts"]:
        return None
    return sum(n * expected_tokens_from_rates(rates, length)
               for length, n in stats["proposal_lengths"].items()) / stats["drafts"]


def proposals(trace: Trace) -> Iterator[tuple[int, SeqState]]:
    """(step, sequence) for every proposal the target verified, in order."""
    for event in trace.events:
        for seq in event.seqs:
            if seq.spec_token_ids:
                yield event.step, seq


def acceptance_stats(trace: Trace) -> AcceptanceStats:
    """The run's acceptance numbers.

    alpha is Leviathan et al.'s: the chance the target accepts a draft token it judges, estimated
    as accepted / judged, where a proposal's judged positions end at its first rejection. vLLM's
    acceptance rate, accepted / proposed, also counts the positions after a rejection, which the
    target never judged (they are discarded with it), as failures: it is lower, falls as k grows,
    and put into the formula it underestimates the speed-up. With independent acceptances at rate
    alpha, accepted / judged tends to alpha and the formula to the measured tokens per call."""
    counts = AcceptanceCounts(trace.info.num_speculative_tokens)
    for _, seq in proposals(trace):
        counts.add(len(seq.spec_token_ids), seq.num_accepted_tokens)
    alpha = counts.alpha
    return AcceptanceStats(
        drafts=counts.drafts, draft_tokens=counts.draft_tokens, accepted_tokens=counts.accepted,
        judged_tokens=counts.judged, alpha=alpha,
        acceptance_rate=counts.accepted / counts.draft_tokens if counts.draft_tokens else None,
        tokens_per_target_call=counts.tokens_per_call,
        expected_tokens_per_target_call=counts.expected_tokens_per_call,
        accepted_per_position=counts.per_position, judged_per_position=counts.judged_per_position,
        proposal_lengths=dict(sorted(counts.lengths.items())))
