"""Random paged-KV inputs laid out the way the engine lays them out, for the kernel tests and the
exercise checks: signed noise in a pool much larger than the batch needs, and block tables that
pick each sequence's blocks from it at random."""

from __future__ import annotations

import torch


def paged_batch(seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """k_cache, v_cache, block_tables (rows padded with arbitrary valid ids), seq_lens (int32)."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = 4 * sum(per_seq) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(device, dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, dtype)
    ids = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, num_blocks, (len(seq_lens), max(per_seq)), generator=gen)
    taken = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = ids[taken:taken + n]
        taken += n
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return k_cache, v_cache, tables.to(device, torch.int32), lens
