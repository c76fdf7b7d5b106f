"""Paged KV memory: fixed-size blocks handed out from one pool, with prefix caching.

Every sequence owns a block table, the list of pool blocks that hold its K/V in order; token i of
the sequence lives in slot `block_table[i // block_size] * block_size + i % block_size`. Blocks are
taken as tokens arrive and returned when the sequence ends, so memory follows actual length rather
than the longest possible one.

Prefix caching: once a block is full, its identity is the hash of its parent block's hash and its
own tokens, so equal hashes mean equal whole prefixes. A new sequence whose leading blocks hash the
same reuses them (their reference count goes up) instead of recomputing them. A block whose count
drops to zero goes back on the free list but keeps its contents and hash: until the pool needs the
block for something else (least recently freed first), a later request can still hit it.
"""

from __future__ import annotations

from collections import OrderedDict

from minillm.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "block_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None  # set once the block is full and registered in the cache
        self.token_ids: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_count={self.ref_count}, cached={self.block_hash is not None})"


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.reset(num_blocks)

    def reset(self, num_blocks: int | None = None) -> None:
        """Every block free and nothing cached, as at start. Sequences holding blocks must have
        been freed (or be dropped) first; the course's checks use this to undo a learner's bugs."""
        self.blocks = [Block(i) for i in range(self.num_blocks if num_blocks is None else num_blocks)]
        # Free blocks in eviction order: the first is reused first. Blocks with nothing worth keeping
        # go to the front, blocks that still hold a cached prefix go to the back.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(len(self.blocks)))
        self.cached_block_ids: dict[int, int] = {}  # block hash -> block id

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks holding a registered prefix, whether in use or free (and still reusable)."""
        return len(self.cached_block_ids)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix matching ---------------------------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold this sequence's leading tokens. The last token is never covered:
        the step that admits a sequence must compute at least one token to sample from; and none while
        the sequence still needs its prompt's logprobs, which only computed tokens have."""
        if not self.enable_prefix_caching or seq.needs_prompt_logprobs:
            return []
        hits: list[int] = []
        parent = None
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            parent = hash_block(parent, tokens)
            block_id = self.cached_block_ids.get(parent)
            # A hash can collide; the tokens themselves decide.
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    # -- allocation ----------------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence) -> bool:
        return self._fits(seq, self.match_prefix(seq))

    def _fits(self, seq: Sequence, hits: list[int]) -> bool:
        # A hit on a free block takes it off the free list as surely as a fresh allocation does.
        reused_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return self.blocks_needed(seq.num_tokens) - len(hits) <= self.num_free_blocks - reused_free

    def allocate(self, seq: Sequence) -> int:
        """Give a newly admitted sequence blocks for all its tokens, reusing cached prefix blocks;
        tokens in hit blocks count as computed already. Returns how many tokens were hits."""
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id!r} already has blocks")
        hits = self.match_prefix(seq)
        if not self._fits(seq, hits):
            raise RuntimeError(f"not enough free KV blocks for {seq.request_id!r}")
        for block_id in hits:
            self._take(block_id)
        seq.block_table = list(hits)
        seq.block_hashes = [self.blocks[b].block_hash for b in hits]
        seq.num_computed_tokens = len(hits) * self.block_size
        self.append_slots(seq)
        return seq.num_computed_tokens

    def can_append(self, seq: Sequence, num_tokens: int | None = None) -> bool:
        """Whether the pool can hold `num_tokens` (default: all of the sequence's tokens)."""
        wanted = self.blocks_needed(seq.num_tokens if num_tokens is None else num_tokens)
        return wanted - len(seq.block_table) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_tokens: int | None = None) -> None:
        wanted = self.blocks_needed(seq.num_tokens if num_tokens is None else num_tokens)
        while len(seq.block_table) < wanted:
            if not self.free_block_ids:
                raise RuntimeError(f"no free KV block left for {seq.request_id!r}")
            block_id = next(iter(self.free_block_ids))
            self.evict(block_id)
            self._take(block_id)
            seq.block_table.append(block_id)

    def cache_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Register the full blocks among seq's first num_tokens tokens (default: those computed), so
        that later requests can hit them. The scheduler registers a prompt's blocks as it schedules
        them, before they are computed (scheduler.py says why that is safe); a block of generated
        tokens is registered once a step has computed it."""
        hashes = seq.block_hashes
        num_full = (seq.num_computed_tokens if num_tokens is None else num_tokens) // self.block_size
        while self.enable_prefix_caching and len(hashes) < num_full:
            i = len(hashes)
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            block_hash = hash_block(hashes[-1] if hashes else None, tokens)
            hashes.append(block_hash)
            block = self.blocks[seq.block_table[i]]
            # Two sequences may compute the same block at once; the first one registered stays.
            if block_hash not in self.cached_block_ids and block.block_hash is None:
                block.block_hash, block.token_ids = block_hash, tokens
                self.cached_block_ids[block_hash] = block.block_id

    def forget_uncomputed(self, seq: Sequence) -> None:
        """Take out of the prefix cache the blocks of seq registered for a step that will not compute
        them (it failed, or was interrupted): they hold no K/V, and a hit on them would read garbage."""
        keep = seq.num_computed_tokens // self.block_size
        for block_id, block_hash in zip(seq.block_table[keep:], seq.block_hashes[keep:]):
            if self.cached_block_ids.get(block_hash) == block_id:
                self.evict(block_id)
        del seq.block_hashes[keep:]

    def free(self, seq: Sequence) -> None:
        """Return a sequence's blocks. Its tail goes back first, so under pressure the pool evicts
        the end of a prefix before its beginning (the beginning is what other prompts share)."""
        self._release(seq.block_table)
        seq.block_table = []

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Return the blocks past seq's first num_tokens tokens (reserved for drafts that were rejected)."""
        keep = self.blocks_needed(num_tokens)
        self._release(seq.block_table[keep:])
        del seq.block_table[keep:]

    def _release(self, block_ids: list[int]) -> None:
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
                self.free_block_ids.move_to_end(block_id, last=block.block_hash is not None)

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_block_ids[block_id]
        block.ref_count += 1

    def evict(self, block_id: int) -> None:
        """Forget the cached prefix a block holds (if any): a free block's before it is reused, or one
        whose K/V were never computed (forget_uncomputed)."""
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self.cached_block_ids[block.block_hash]
            block.block_hash, block.token_ids = None, ()
