"""Attention backends: where K and V live between steps, and how queries attend over them.

The model calls `attn(layer_idx, q, k, v)` and knows nothing else; the model runner binds a
backend to one step's metadata. Swapping the KV cache layout or the kernel never touches the model.
"""

from minillm.attention.base import AttentionBackend, AttentionMetadata
from minillm.attention.contiguous import ContiguousAttention
from minillm.attention.no_cache import NoCacheAttention
from minillm.attention.reference import append_and_attend, attend

__all__ = ["AttentionBackend", "AttentionMetadata", "ContiguousAttention", "NoCacheAttention",
           "append_and_attend", "attend"]
