"""No KV cache at all: every step feeds each sequence's whole history through the model again.

This is what generation costs without a cache (quadratic in the length), kept so that the course
can measure it; nothing is stored between steps."""

from __future__ import annotations

import torch

from minillm.attention.base import AttentionMetadata, BatchDescriptor, query_start_loc
from minillm.attention.per_sequence import attend
from minillm.layers.rotary import QKRotation
from minillm.sequence import Sequence


class NoCacheAttention:
    name = "none"
    supports_cuda_graphs = False  # nothing persistent to attend over

    def build_metadata(self, seqs: list[Sequence], start_pos: list[int], query_lens: list[int],
                       batch: BatchDescriptor | None = None) -> AttentionMetadata:
        return AttentionMetadata(query_start_loc=query_start_loc(query_lens), start_pos=list(start_pos))

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                metadata: AttentionMetadata, rotation: QKRotation | None = None) -> torch.Tensor:
        if rotation is not None:
            q, k = rotation(q, k)
        loc = metadata.query_start_loc
        return torch.cat([attend(q[s:e], k[s:e], v[s:e], q_start=0)
                          for s, e in zip(loc[:-1], loc[1:])])
