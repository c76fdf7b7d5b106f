"""One interface over the three KV caches the engine can run with, so that the scheduler never asks
which one it has:

- "paged": blocks from one preallocated pool (kv/pool.py), handed out by the block manager;
- "contiguous": one buffer per sequence, reserved for its longest possible length (kv/contiguous_cache.py);
- "none": nothing is kept, and every step feeds each sequence's whole history again.

The scheduler allocates, appends and frees through it and tells it what each step computed. It keeps
the scheduler's bookkeeping only: reading and writing K and V in a step is the attention backend's
work (minillm/attention: attention/selector.py picks the backend for a cache, over its storage).
"""

from __future__ import annotations

import torch

from minillm.config.engine import CacheConfig
from minillm.config.model import ModelConfig
from minillm.kv.block_manager import BlockManager
from minillm.kv.contiguous_cache import ContiguousKVCache
from minillm.kv.pool import KVPool, resolve_num_kv_blocks
from minillm.sequence import Sequence


class KVCacheManager:
    """The interface, and what a cache does unless it says otherwise: it keeps what was computed and
    needs no room for it beyond what `allocate` reserved."""

    name: str  # "paged", "contiguous" or "none"
    storage: KVPool | ContiguousKVCache | None = None  # where K and V live
    block_manager: BlockManager | None = None
    block_size = num_blocks = num_free_blocks = 0  # paged only
    cached_block_ids: dict[int, int] = {}  # paged only: prefix-cache hash -> block

    def num_new_tokens(self, seq: Sequence, budget: int) -> int:
        """Tokens seq computes in a step that has `budget` tokens left."""
        return min(seq.num_tokens - seq.num_computed_tokens, budget)

    def can_allocate(self, seq: Sequence) -> bool:
        return True

    def allocate(self, seq: Sequence) -> int:
        """Memory for a newly admitted sequence; returns how many of its tokens were prefix-cache hits."""
        return 0

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether seq's first num_tokens tokens fit without preempting anyone."""
        return True

    def append(self, seq: Sequence, num_tokens: int) -> None:
        """Room for seq's first num_tokens tokens (can_append said it fits)."""

    def free(self, seq: Sequence) -> None:
        pass

    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        """A step computed num_tokens more of seq's tokens, all of them final: the cache holds them now."""
        seq.num_computed_tokens += num_tokens

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """A step is to compute seq's tokens up to num_tokens, all of them known: a cache that shares
        prefixes lets requests scheduled after it find them (prefix caching)."""

    def forget_uncomputed(self, seq: Sequence) -> None:
        """Undo cache_blocks for what seq has not computed: the step that was to compute it will not run."""

    def truncate(self, seq: Sequence) -> None:
        """Give back room reserved past seq's tokens (lookahead slots of rejected drafts)."""

    def reserved_tokens(self, seq: Sequence) -> int:
        return 0


class NoKVCache(KVCacheManager):
    name = "none"

    def num_new_tokens(self, seq: Sequence, budget: int) -> int:
        return seq.num_tokens  # nothing is cached, so nothing can be split across steps either

    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        pass  # nothing was kept: num_computed_tokens stays 0


class ContiguousKVCacheManager(KVCacheManager):
    name = "contiguous"

    def __init__(self, storage: ContiguousKVCache) -> None:
        self.storage = storage

    def can_allocate(self, seq: Sequence) -> bool:
        return self.storage.can_allocate(seq)

    def allocate(self, seq: Sequence) -> int:
        self.storage.allocate(seq)  # the whole reservation at once: appending never needs more
        return 0

    def free(self, seq: Sequence) -> None:
        self.storage.free(seq)

    def reserved_tokens(self, seq: Sequence) -> int:
        return seq.max_len


class PagedKVCacheManager(KVCacheManager):
    name = "paged"

    def __init__(self, block_manager: BlockManager, pool: KVPool | None = None) -> None:
        """pool may be left out where only scheduling is exercised (tests, checks)."""
        self.block_manager = block_manager
        self.storage = pool
        self.block_size = block_manager.block_size

    def can_allocate(self, seq: Sequence) -> bool:
        return self.block_manager.can_allocate(seq)

    def allocate(self, seq: Sequence) -> int:
        return self.block_manager.allocate(seq)

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return self.block_manager.can_append(seq, num_tokens)

    def append(self, seq: Sequence, num_tokens: int) -> None:
        self.block_manager.append_slots(seq, num_tokens)

    def free(self, seq: Sequence) -> None:
        self.block_manager.free(seq)

    def mark_computed(self, seq: Sequence, num_tokens: int) -> None:
        seq.num_computed_tokens += num_tokens
        self.block_manager.cache_full_blocks(seq)

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        self.block_manager.cache_full_blocks(seq, num_tokens)

    def forget_uncomputed(self, seq: Sequence) -> None:
        self.block_manager.forget_uncomputed(seq)

    def truncate(self, seq: Sequence) -> None:
        self.block_manager.truncate(seq, seq.num_tokens)

    def reserved_tokens(self, seq: Sequence) -> int:
        return len(seq.block_table) * self.block_size

    @property
    def num_blocks(self) -> int:
        return self.block_manager.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def cached_block_ids(self) -> dict[int, int]:
        return self.block_manager.cached_block_ids




def create_kv_cache_manager(config: CacheConfig, model_config: ModelConfig, dtype: torch.dtype,
                            device: torch.device, max_model_len: int,
                            max_num_seqs: int, extra_bytes_per_token: int = 0) -> KVCacheManager:
    if config.kv_cache == "none":
        return NoKVCache()
    # Both caches get the same budget, so that they can be compared on equal memory.
    num_blocks = resolve_num_kv_blocks(
        config.num_kv_blocks, config.gpu_memory_utilization, config=model_config, block_size=config.block_size,
        dtype=dtype, device=device, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        kv_cache_dtype=config.kv_cache_dtype, extra_bytes_per_token=extra_bytes_per_token)
    if config.kv_cache == "contiguous":
        return ContiguousKVCacheManager(ContiguousKVCache(model_config, dtype, device, num_blocks * config.block_size))
    pool = KVPool(model_config, num_blocks, config.block_size, dtype, device, config.kv_cache_dtype)
    return PagedKVCacheManager(BlockManager(num_blocks, config.block_size, config.enable_prefix_caching), pool)
