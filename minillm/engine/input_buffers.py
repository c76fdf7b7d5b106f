"""The step's token ids, positions and the rows that get logits, on the device, allocated once at start.

Every step writes its inputs into the front rows of these tensors instead of allocating new ones
(utils/staging.py): their addresses never change, which is what lets a CUDA graph captured at
start-up read each later step's inputs (cuda_graph.py). The attention metadata lives likewise in
tensors of the attention backend's own, in the same StagingArena: a step's inputs reach the device
in one copy.
"""

from __future__ import annotations

import torch

from minillm.utils.staging import StagingArena


class InputBuffers:
    def __init__(self, max_num_tokens: int, arena: StagingArena) -> None:
        self.arena = arena
        self.input_ids = arena.buffer(max_num_tokens, dtype=torch.long)
        self.positions = arena.buffer(max_num_tokens, dtype=torch.long)
        self.logits_indices = arena.buffer(max_num_tokens, dtype=torch.long)
        # The input rows of tokens still on the device, to copy them into input_ids: the drafts a draft
        # model made, or the tokens the step before sampled (async scheduling), from these rows of its
        # sampled tokens.
        self.draft_rows = arena.buffer(max_num_tokens, dtype=torch.long)
        self.previous_rows = arena.buffer(max_num_tokens, dtype=torch.long)
