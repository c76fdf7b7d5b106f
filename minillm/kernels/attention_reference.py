"""Plain-PyTorch references for the paged-KV kernels: the ground truth every kernel is tested
against, and the `torch` attention backend itself. `attend`, attention over one sequence's K/V, is
the reference under them all (and under the contiguous and no-cache backends, in minillm.attention).

Layout shared by all of them: the pool of one layer is `k_cache, v_cache: [num_blocks, block_size,
num_kv_heads, head_dim]`; a token's slot is `block_id * block_size + offset`; `block_tables:
[num_seqs, max_blocks]` (int32, unused entries arbitrary); `seq_lens: [num_seqs]` counts every token
of a sequence whose K/V are in the pool, this step's included.

An int8 pool (kv_cache_dtype="int8") comes with `k_scales, v_scales: [num_blocks, block_size,
num_kv_heads]` (fp32): each (token, head) row of head_dim values is stored as round(x / s), clamped to
[-127, 127], with s = max|x| / 127 (the symmetric formula of int8 weights, a row being one token's
head). Every function takes them as optional keywords: stores quantize, attention dequantizes what it
reads back to q's dtype. Without them the pool holds K and V as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minillm.quant.int8 import dequantize_int8, quantize_int8


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int,
           scale: float | None = None) -> torch.Tensor:
    """Causal attention of n queries at positions q_start .. q_start+n-1 over keys 0 .. L-1.

    q: [n, heads, head_dim]; k, v: [L, kv_heads, head_dim] -> [n, heads, head_dim].
    With grouped-query attention several query heads share one KV head. Rather than copying K and
    V once per query head, the queries of a group are stacked into one longer batch of rows, so
    each KV head is read once: [n, kv_heads, group, d] -> [kv_heads, group * n, d].
    scale defaults to 1/sqrt(head_dim).
    """
    n, num_heads, head_dim = q.shape
    length, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    qg = q.view(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, group * n, head_dim)
    mask = None
    if n > 1 or q_start + n != length:
        q_pos = q_start + torch.arange(n, device=q.device)
        mask = (torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]).repeat(group, 1)
    out = F.scaled_dot_product_attention(qg, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale)
    return out.view(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3).reshape(n, num_heads, head_dim)


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (int8 [..., head_dim], fp32 scales [...]): one scale per row of head_dim."""
    q, scales = quantize_int8(x.reshape(-1, x.shape[-1]).float())
    return q.view(x.shape), scales.view(x.shape[:-1])


def dequantize_kv(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of quantize_kv, computed in fp32 and rounded to dtype."""
    return dequantize_int8(q.reshape(-1, q.shape[-1]), scales.reshape(-1)).view(q.shape).to(dtype)


def store_kvcache_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, *, k_scales: torch.Tensor | None = None,
                      v_scales: torch.Tensor | None = None) -> None:
    """Write k, v: [tokens, kv_heads, head_dim] into their slots; a slot of -1 is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for x, cache, scales in ((k, k_cache, k_scales), (v, v_cache, v_scales)):
        x = x[keep]
        if scales is not None:
            x, s = quantize_kv(x)
            scales.view(-1, scales.shape[2])[slots] = s
        cache.view(-1, *cache.shape[2:])[slots] = x


def select_blocks(cache: torch.Tensor, block_ids: torch.Tensor, scales: torch.Tensor | None = None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """cache[block_ids] (block_ids int64), dequantized to dtype if the cache is int8 (scales given)."""
    # index_select: on a CPU several times faster than the equivalent cache[block_ids] indexing.
    blocks = cache.index_select(0, block_ids)
    return blocks if scales is None else dequantize_kv(blocks, scales.index_select(0, block_ids), dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int, scales: torch.Tensor | None = None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One sequence's first `length` tokens out of the pool, in order: [length, kv_heads, head_dim]
    (an int8 pool's dequantized to dtype)."""
    num_blocks = -(-length // cache.shape[1])
    return select_blocks(cache, block_table[:num_blocks].long(), scales, dtype).flatten(0, 1)[:length]


def paged_decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                               max_seq_len: int | None = None, *, k_scales: torch.Tensor | None = None,
                               v_scales: torch.Tensor | None = None) -> torch.Tensor:
    """One query per sequence, its last token: q [num_seqs, heads, head_dim] -> same shape.
    The whole batch in one attention call: every sequence's blocks are gathered into rows of equal
    length (a copy of its K/V, which the Triton kernel avoids), and keys past its length are masked.
    max_seq_len (and max_query_len below) spare a kernel reading lengths back from the GPU; the
    reference does not need them."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    blocks = block_tables.flatten().long()
    k = select_blocks(k_cache, blocks, k_scales, q.dtype).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = select_blocks(v_cache, blocks, v_scales, q.dtype).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    visible = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens[:, None]
    # The query heads sharing a KV head are its rows (grouped-query attention): [num_seqs, kv_heads, group, d].
    qg = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=visible[:, None, None, :], scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


# The decode kernel's context tokens per split unless a block holds more: a partition is whole blocks,
# and the pool's blocks may be up to 1,024 tokens long.
PARTITION_SIZE = 512


def default_partition(block_size: int) -> int:
    return max(PARTITION_SIZE, block_size)


def paged_decode_partitions_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                                max_seq_len: int | None = None, partition_size: int | None = None, *,
                                k_scales: torch.Tensor | None = None,
                                v_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV pass of the decode kernel: each sequence's context cut into partitions of
    partition_size tokens, as many as the longest sequence needs. Returns part_out [num_seqs, heads,
    num_parts, head_dim] (fp32), each partition's softmax over its own keys applied to their values,
    0 where it has no key; and lse [num_seqs, heads, num_parts], log(sum(exp(scores))) over its keys,
    -inf where it has none. Merging them exactly gives paged_decode_attention_ref. partition_size
    defaults to the kernel's (`default_partition`)."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if partition_size is None:
        partition_size = default_partition(k_cache.shape[1])
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    num_parts = -(-max_seq_len // partition_size)
    width = num_parts * partition_size
    blocks = block_tables.flatten().long()
    k, v = (select_blocks(cache, blocks, scales, torch.float32).float().view(num_seqs, -1, num_kv_heads,
                                                                             head_dim)
            for cache, scales in ((k_cache, k_scales), (v_cache, v_scales)))
    # Positions past the block table (a short table, a long max_seq_len) are no keys: zeros, masked below.
    k, v = (F.pad(x[:, :width], (0, 0, 0, 0, 0, width - min(width, x.shape[1]))).transpose(1, 2) for x in (k, v))
    qg = q.float().view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = (qg @ k.transpose(2, 3) * scale).view(num_seqs, num_heads, num_parts, partition_size)
    visible = torch.arange(width, device=q.device)[None, :] < seq_lens[:, None]
    scores = scores.masked_fill(~visible.view(num_seqs, 1, num_parts, partition_size), float("-inf"))
    lse = torch.logsumexp(scores, dim=3)
    weights = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])  # 0 for no key
    values = v.view(num_seqs, num_kv_heads, 1, num_parts, partition_size, head_dim)
    group = num_heads // num_kv_heads
    part_out = weights.view(num_seqs, num_kv_heads, group, num_parts, 1, partition_size) @ values
    return part_out.view(num_seqs, num_heads, num_parts, head_dim), lse


def paged_prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                                block_tables: torch.Tensor, scale: float,
                                max_query_len: int | None = None, *, k_scales: torch.Tensor | None = None,
                                v_scales: torch.Tensor | None = None) -> torch.Tensor:
    """A ragged batch: sequence i's queries are q[cu_seqlens_q[i]:cu_seqlens_q[i+1]], its last
    tokens; they attend causally to its cached prefix and to each other, all read from the pool. A
    sequence may bring any number of queries: a prompt chunk, a decode's one, a verification's 1 + k.
    One with no keys (seq_lens 0: a CUDA graph's padding) gets zeros.
    q: [total_tokens, heads, head_dim] -> same shape."""
    out = torch.empty_like(q)
    bounds = cu_seqlens_q.tolist()
    for i, length in enumerate(seq_lens.tolist()):
        s, e = bounds[i], bounds[i + 1]
        if length == 0:
            out[s:e] = 0
            continue
        k = gather_kv(k_cache, block_tables[i], length, k_scales, q.dtype)
        v = gather_kv(v_cache, block_tables[i], length, v_scales, q.dtype)
        out[s:e] = attend(q[s:e], k, v, q_start=length - (e - s), scale=scale)
    return out
