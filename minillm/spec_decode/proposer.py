"""What the model runner asks of a proposer (the draft model, n-gram lookup)."""

from __future__ import annotations

from typing import Protocol

from minillm.sample.proposal import Proposal
from minillm.sequence import Sequence


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> Proposal:
        """Up to num_tokens[i] draft tokens to follow seqs[i]'s tokens."""
