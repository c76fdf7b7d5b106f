"""A proposal whose drafts are still on the device: where each goes in the target's input, the
sequences a verification keeps, and the drafts read back with the target's tokens in one copy."""

from __future__ import annotations

import torch

from minillm.sample.proposal import Proposal

# Four sequences: 0 drafts 2 tokens, 1 is a prompt chunk (no drafts), 2 drafts 3, 3 drafts none.
# The draft model made them step by step: step 0 for sequences 0 and 2, step 1 for both, step 2 for 2.
DEVICE_SEQS = [0, 2, 0, 2, 2]
TOKENS = [10, 20, 11, 21, 22]


def on_device() -> Proposal:
    return Proposal([2, 0, 3, 0], [None] * 4, None, torch.tensor(TOKENS), DEVICE_SEQS)


def test_each_draft_goes_to_its_sequences_last_rows_in_order():
    # Input rows: sequence 0 owns 0-2 (its last token, then 2 drafts), 1 owns 3-9, 2 owns 10-13, 3 owns 14.
    rows = on_device().device_rows([2, 9, 13, 14])
    assert rows == [1, 11, 2, 12, 13]
    ids = torch.zeros(15, dtype=torch.long)
    ids.index_copy_(0, torch.tensor(rows), torch.tensor(TOKENS))
    assert ids[1:3].tolist() == [10, 11] and ids[11:14].tolist() == [20, 21, 22]


def test_the_drafts_and_another_tensor_come_back_together():
    proposal = on_device()
    assert proposal.on_device
    assert proposal.read_with(torch.tensor([7, 8, 9])).tolist() == [7, 8, 9]
    assert not proposal.on_device
    assert proposal.token_ids == [[10, 11], [], [20, 21, 22], []]
    assert proposal.read_with(torch.tensor([5])).tolist() == [5]  # already read: only the other


def test_selecting_the_sampled_sequences_renumbers_them():
    selected = on_device().select([0, 2, 3])
    assert selected.num_tokens == [2, 3, 0] and selected.on_device
    assert selected.device_rows([2, 6, 7]) == [1, 4, 2, 5, 6]
    assert selected.token_ids == [[10, 11], [20, 21, 22], []]
    read = on_device()
    read.read_with(torch.tensor([], dtype=torch.long))
    assert read.select([2, 0]).token_ids == [[20, 21, 22], [10, 11]]


def test_a_proposal_made_on_the_host_is_never_on_the_device():
    proposal = Proposal.from_lists([[1, 2], []], [None, None])
    assert not proposal.on_device and proposal.num_tokens == [2, 0] and proposal.token_ids == [[1, 2], []]
