"""A contiguous KV cache: each running sequence owns one buffer sized for its longest possible
length. New K/V are appended at the sequence's current position, and attention reads the filled
prefix. Simple and fast to index, but the unused tail of every buffer is reserved memory that
nobody else can use: the waste that paging removes."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.attention.base import AttentionMetadata, BatchDescriptor, query_start_loc
from minillm.attention.per_sequence import append_and_attend
from minillm.kv.contiguous_cache import ContiguousKVCache
from minillm.layers.rotary import QKRotation
from minillm.sequence import Sequence

CacheAttentionFn = Callable[..., torch.Tensor]


class ContiguousAttention:
    name = "contiguous"
    supports_cuda_graphs = False  # one Python tensor per sequence, grown step by step

    def __init__(self, cache: ContiguousKVCache, cache_attention: CacheAttentionFn = append_and_attend) -> None:
        self.cache = cache
        # Replaceable: the course plugs a learner's own append-and-attend in here.
        self.cache_attention = cache_attention

    def build_metadata(self, seqs: list[Sequence], start_pos: list[int], query_lens: list[int],
                       batch: BatchDescriptor | None = None) -> AttentionMetadata:
        return AttentionMetadata(query_start_loc=query_start_loc(query_lens), start_pos=list(start_pos),
                                 kv_buffers=[self.cache.buffer(seq) for seq in seqs])

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                metadata: AttentionMetadata, rotation: QKRotation | None = None) -> torch.Tensor:
        if rotation is not None:
            q, k = rotation(q, k)
        loc = metadata.query_start_loc
        outs = []
        for i, buf in enumerate(metadata.kv_buffers):
            s, e = loc[i], loc[i + 1]
            outs.append(self.cache_attention(q[s:e], k[s:e], v[s:e], buf[layer_idx, 0],
                                             buf[layer_idx, 1], metadata.start_pos[i]))
        return torch.cat(outs)
