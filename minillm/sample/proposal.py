"""What a proposer (spec_decode/) hands the rejection sampler: draft tokens per sequence and the
distributions they came from.

A draft model's tokens are made on the device, and the host need not see them before the target
verifies them: the runner copies them into the target's input there (`ModelRunner.prepare`, at
`device_rows`), and the rejection sampler reads them back in the same copy as the target's own
tokens (`read_with`). An all-greedy step without penalties then waits for the device once, where
reading the drafts first made the host wait for the draft model before it could even prepare the
target's step. (Penalties and sampling need the drafts' values before the target's tokens: those
steps read them first, and wait twice.)
"""

from __future__ import annotations

import torch


class Proposal:
    def __init__(self, num_tokens: list[int], probs: list[torch.Tensor | None],
                 token_ids: list[list[int]] | None = None, device_token_ids: torch.Tensor | None = None,
                 device_seqs: list[int] | None = None) -> None:
        """num_tokens: drafts per sequence of the batch (at most the k it was given; may be 0); probs: q
        per sequence, [num_tokens, V], None where the drafts are one-hot. The drafts themselves either as
        token_ids, a list per sequence, or still on the device: device_token_ids [n], in any order,
        device_seqs naming the sequence of each, each sequence's in draft order."""
        self.num_tokens = num_tokens
        self.probs = probs
        self._token_ids = token_ids
        self.device_token_ids = device_token_ids
        self.device_seqs = device_seqs or []

    @classmethod
    def from_lists(cls, token_ids: list[list[int]], probs: list[torch.Tensor | None]) -> Proposal:
        return cls([len(ids) for ids in token_ids], probs, token_ids)

    @property
    def on_device(self) -> bool:
        """Whether the host has not read the drafts yet."""
        return self._token_ids is None

    @property
    def token_ids(self) -> list[list[int]]:
        """The drafts per sequence, read from the device now if still there."""
        if self._token_ids is None:
            self.read_with(self.device_token_ids[:0])
        return self._token_ids

    def read_with(self, other: torch.Tensor) -> torch.Tensor:
        """other (a 1-D tensor of the drafts' dtype, on their device) copied to the host in the same copy
        as the drafts, which the proposal then holds: one wait for both."""
        if self._token_ids is not None:
            return other.cpu()
        n = len(self.device_seqs)
        values = torch.cat([self.device_token_ids, other]).cpu()
        self._token_ids = [[] for _ in self.num_tokens]
        for i, token in zip(self.device_seqs, values[:n].tolist()):
            self._token_ids[i].append(token)
        return values[n:]

    def select(self, rows: list[int]) -> Proposal:
        """The proposal of the sequences `rows` only, in that order (the others must have no drafts)."""
        if self._token_ids is not None:
            return Proposal.from_lists([self._token_ids[i] for i in rows], [self.probs[i] for i in rows])
        new_index = {i: row for row, i in enumerate(rows)}
        return Proposal([self.num_tokens[i] for i in rows], [self.probs[i] for i in rows], None,
                        self.device_token_ids, [new_index[i] for i in self.device_seqs])

    def device_rows(self, last_rows: list[int]) -> list[int]:
        """The target's input row of each draft on the device, in device order, where sequence i's last
        input row is last_rows[i]: its drafts are the last num_tokens[i] of its rows."""
        seen = [0] * len(self.num_tokens)
        rows = []
        for i in self.device_seqs:
            rows.append(last_rows[i] - self.num_tokens[i] + 1 + seen[i])
            seen[i] += 1
        return rows
