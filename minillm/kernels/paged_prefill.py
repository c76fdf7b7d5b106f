"""Prefill attention over a ragged batch with a paged KV cache, in Triton (reference:
`reference.paged_prefill_attention_ref`).

Sequences of different lengths are concatenated without padding; `cu_seqlens_q` marks where each
one's new tokens start. Their K/V have already been written to the pool, so a query at position p
attends to keys 0..p of its own sequence, all read through the block table: the cached prefix
(a prefix-cache hit, or earlier chunks of a chunked prefill) and this step's tokens alike.

One program computes a tile of BLOCK_M queries of one head of one sequence, streaming keys in tiles
of BLOCK_N with the online softmax of FlashAttention; tiles past the causal limit are never loaded,
and only tiles that straddle it are masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels import check_kv_layout, dot_precision
from minillm.kernels.targets import GPUSpec, first_fitting, launch_target, shared_bytes_bound
from minillm.kernels.tiles import load_kv_tile, online_softmax_step


@triton.jit(do_not_specialize=["stride_table_seq"])  # the block tables' width changes every step
def _prefill_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, block_tables_ptr, cu_seqlens_q_ptr,
        seq_lens_ptr, out_ptr, scale,
        stride_q_token, stride_q_head, stride_cache_block, stride_cache_slot, stride_cache_head,
        stride_table_seq, stride_out_token, stride_out_head,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len
    kv_head = head // GROUP

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DIM_PAD)
    mask_m = offs_m < q_len
    mask_d = offs_d < HEAD_DIM
    q_pos = context_len + offs_m
    q = tl.load(q_ptr + (q_start + offs_m)[:, None] * stride_q_token + head * stride_q_head + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    table = block_tables_ptr + seq * stride_table_seq
    end = tl.minimum(seq_len, context_len + (tile + 1) * BLOCK_M)  # the tile's last query sees no further
    # Keys up to the tile's first query are visible to all its queries: whole tiles of them need no
    # causal mask, which is most tiles of a long prompt. Only the tiles along the diagonal do.
    unmasked_end = (context_len + tile * BLOCK_M + 1) // BLOCK_N * BLOCK_N
    for start_n in range(0, unmasked_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table, offs_n, offs_n < unmasked_end, kv_head, offs_d,
                            mask_d, stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE,
                            k_scales_ptr, v_scales_ptr)
        m, denom, acc = online_softmax_step(q, k, v, None, m, denom, acc, scale, PRECISION)
    for start_n in range(unmasked_end, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table, offs_n, mask_n, kv_head, offs_d, mask_d,
                            stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE, k_scales_ptr,
                            v_scales_ptr)
        visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])  # causal
        m, denom, acc = online_softmax_step(q, k, v, visible, m, denom, acc, scale, PRECISION)

    out = acc / denom[:, None]
    tl.store(out_ptr + (q_start + offs_m)[:, None] * stride_out_token + head * stride_out_head + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def prefill_tiles(target: GPUSpec | None, dim_pad: int, element_size: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): 64 x 64 where a block's shared memory holds a tile of queries and tiles of
    K and V that size, smaller where it does not (a T4 at head dim 128 in fp16 is exactly full).
    fp32 runs on a GPU for exactness (tests, exercise checks), not speed: it takes 32 x 32 tiles,
    which fit every GPU and compile in a fraction of the time."""
    if target is None:
        return 32, 64  # the interpreter runs each program in Python: fewer, bigger tiles are faster there
    candidates = [(64, 64), (64, 32), (32, 32), (16, 16)]
    return first_fitting(target, candidates[2:] if element_size == 4 else candidates,
                         lambda t: shared_bytes_bound(target, t[0] + 2 * t[1], dim_pad, element_size))


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                            scale: float, max_query_len: int | None = None, *, k_scales: torch.Tensor | None = None,
                            v_scales: torch.Tensor | None = None) -> torch.Tensor:
    """q: [total_tokens, heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim];
    k_scales, v_scales: an int8 cache's scales, [num_blocks, block_size, kv_heads]."""
    total_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    block_m, block_n = prefill_tiles(launch_target(q.device), dim_pad, q.element_size())
    out = torch.empty_like(q)
    check_kv_layout(k_cache, v_cache, k_scales, v_scales)
    assert q.stride(2) == 1
    _prefill_kernel[(triton.cdiv(max_query_len, block_m), num_seqs, num_heads)](
        q, k_cache, v_cache, k_scales, v_scales, block_tables, cu_seqlens_q, seq_lens, out, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=block_n, PRECISION=dot_precision(q.dtype))
    return out
