"""What a proposer hands the verifier: draft tokens per sequence and the distributions they came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from minillm.sequence import Sequence


@dataclass
class Proposal:
    token_ids: list[list[int]]  # per sequence of the batch, at most the k it was given; may be empty
    probs: list[torch.Tensor | None]  # q per sequence, [len(tokens), V]; None: one-hot on the tokens


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> Proposal:
        """Up to num_tokens[i] draft tokens to follow seqs[i]'s tokens."""
