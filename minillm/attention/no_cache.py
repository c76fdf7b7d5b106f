"""No KV cache at all: every step feeds each sequence's whole history through the model again.

This is what generation costs without a cache (quadratic in the length), kept so that the course
can measure it; nothing is stored between steps."""

from __future__ import annotations

import torch

from minillm.attention.base import AttentionMetadata
from minillm.attention.reference import attend


class NoCacheAttention:
    name = "none"

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        loc = metadata.query_start_loc
        return torch.cat([attend(q[s:e], k[s:e], v[s:e], q_start=0)
                          for s, e in zip(loc[:-1], loc[1:])])
