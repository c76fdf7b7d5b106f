"""The attention backend that reads and writes an engine's KV cache: one per cache kind."""

from __future__ import annotations

from minillm.attention.base import AttentionBackend
from minillm.attention.contiguous import ContiguousAttention
from minillm.attention.no_cache import NoCacheAttention
from minillm.attention.paged import PagedAttention
from minillm.kernels.ops import KernelOps
from minillm.kv.cache_manager import KVCacheManager
from minillm.utils.staging import StagingArena


def create_attention_backend(kv_cache_manager: KVCacheManager, ops: KernelOps, head_dim: int, max_num_tokens: int,
                             max_num_seqs: int, max_model_len: int, arena: StagingArena) -> AttentionBackend:
    """max_num_tokens, max_num_seqs: the most one step computes, which the paged backend's metadata
    tensors are sized for; arena: where it stages them (utils/staging.py)."""
    if kv_cache_manager.name == "none":
        return NoCacheAttention()
    if kv_cache_manager.name == "contiguous":
        return ContiguousAttention(kv_cache_manager.storage)
    return PagedAttention(kv_cache_manager.storage, ops, head_dim, max_num_tokens, max_num_seqs, max_model_len, arena)
