"""Attention backends: where K and V live between steps, and how queries attend over them.

The model calls `attn(layer_idx, q, k, v)` and knows nothing else; each backend builds the metadata
it reads from the step's sequences, and the model runner binds the backend to it. Swapping the KV
cache layout or the kernel never touches the model.
"""

from minillm.attention.base import AttentionBackend, AttentionMetadata, BatchDescriptor
from minillm.attention.contiguous import ContiguousAttention
from minillm.attention.no_cache import NoCacheAttention
from minillm.attention.per_sequence import append_and_attend, attend

__all__ = ["AttentionBackend", "AttentionMetadata", "BatchDescriptor", "ContiguousAttention", "NoCacheAttention",
           "append_and_attend", "attend"]
