"""Prompt lookup (n-gram) drafts: find the sequence's last n tokens earlier in the sequence and
propose the tokens that followed them there. No model at all; it pays where text repeats itself
(code that reuses names, edits of a given document, retrieved passages quoted back)."""

from __future__ import annotations

import numpy as np

from minillm.config.speculative import SpeculativeConfig
from minillm.sample.proposal import Proposal
from minillm.sequence import Sequence


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> Proposal:
        drafts = [lookup(seq.token_ids, k, self.min_n, self.max_n) if k else [] for seq, k in zip(seqs, num_tokens)]
        return Proposal.from_lists(drafts, [None] * len(seqs))


def lookup(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of token_ids
    (max_n tokens down to min_n) that occurs earlier."""
    tokens = np.asarray(token_ids)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        # Windows of n tokens that end before the last token: the suffix itself is not a match.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            return tokens[start:start + k].tolist()
    return []
