"""Plain-PyTorch references for the paged-KV kernels: the ground truth every kernel is tested
against, and the `torch` attention backend itself.

Layout shared by all of them: the pool of one layer is `k_cache, v_cache: [num_blocks, block_size,
num_kv_heads, head_dim]`; a token's slot is `block_id * block_size + offset`; `block_tables:
[num_seqs, max_blocks]` (int32, unused entries arbitrary); `seq_lens: [num_seqs]` counts every token
of a sequence whose K/V are in the pool, this step's included.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.attention.reference import attend


def store_kvcache_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """Write k, v: [tokens, kv_heads, head_dim] into their slots; a slot of -1 is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's first `length` tokens out of the pool, in order: [length, kv_heads, head_dim]."""
    num_blocks = -(-length // cache.shape[1])
    # index_select: on a CPU several times faster than the equivalent cache[block_table] indexing.
    return cache.index_select(0, block_table[:num_blocks].long()).flatten(0, 1)[:length]


def paged_decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                               max_seq_len: int | None = None) -> torch.Tensor:
    """One query per sequence, its last token: q [num_seqs, heads, head_dim] -> same shape.
    The whole batch in one attention call: every sequence's blocks are gathered into rows of equal
    length (a copy of its K/V, which the Triton kernel avoids), and keys past its length are masked.
    max_seq_len (and max_query_len below) spare a kernel reading lengths back from the GPU; the
    reference does not need them."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    blocks = block_tables.flatten().long()
    k = k_cache.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)  # [.., L, d]
    v = v_cache.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    visible = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens[:, None]
    # The query heads sharing a KV head are its rows (grouped-query attention): [num_seqs, kv_heads, group, d].
    qg = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=visible[:, None, None, :], scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def paged_prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                                block_tables: torch.Tensor, scale: float,
                                max_query_len: int | None = None) -> torch.Tensor:
    """A ragged batch: sequence i's queries are q[cu_seqlens_q[i]:cu_seqlens_q[i+1]], its last
    tokens; they attend causally to its cached prefix and to each other, all read from the pool.
    q: [total_tokens, heads, head_dim] -> same shape."""
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for i, length in enumerate(seq_lens.tolist()):
        s, e = bounds[i], bounds[i + 1]
        k = gather_kv(k_cache, block_tables[i], length)
        v = gather_kv(v_cache, block_tables[i], length)
        out[s:e] = attend(q[s:e], k, v, q_start=length - (e - s), scale=scale)
    return out
