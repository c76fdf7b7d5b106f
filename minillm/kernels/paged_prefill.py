"""Paged attention over a ragged batch, in Triton (reference:
`attention_reference.paged_prefill_attention_ref`): any mix of prompt chunks (with a cached prefix),
decode rows (one query) and verification rows (1 + k queries), in one launch.

Sequences of different lengths are concatenated without padding; `cu_seqlens_q` marks where each
one's new tokens start. Their K/V have already been written to the pool, so a query at position p
attends to keys 0..p of its own sequence, all read through the block table: the cached prefix (a
prefix-cache hit, earlier chunks of a chunked prefill, a decode's context) and this step's tokens.

The launch depends only on how many token rows and sequence rows there are, never on how the tokens
are shared out among the sequences: the grid is (token rows // BLOCK_Q + sequence rows, KV heads).
Sequence i's tiles of BLOCK_Q queries are numbered from cu_seqlens_q[i] // BLOCK_Q + i, which
leaves room for a partial tile at each end; a program finds its sequence by binary search over
those numbers and returns at once if its tile lies past the sequence's end. So one CUDA graph,
captured for a number of token rows, replays every batch that fits in them (vLLM's unified
attention kernel works this way).

A program takes BLOCK_Q queries together with all GROUP query heads that share one KV head, as
BLOCK_M = BLOCK_Q * GROUP rows (grouped-query attention): each K/V tile is loaded once for the whole
group. Keys before the tile's first query are visible to all its rows and need no mask; only the
tiles along the diagonal are masked. Scores are in base 2 (`tiles.online_softmax_step`).

A sequence row with no keys (seq_lens 0: a CUDA graph's padding) gives zeros; token rows past
cu_seqlens_q[-1] are left unwritten.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels import check_kv_layout, dot_precision
from minillm.kernels.targets import GPUSpec, first_fitting, launch_target, shared_bytes_estimate
from minillm.kernels.tiles import LOG2E, load_kv_tile, online_softmax_step


# The sequence count and the block tables' width change every step: not specialized on, so that a
# step never waits for a compile.
@triton.jit(do_not_specialize=["num_seqs", "stride_table_seq"])
def _ragged_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, block_tables_ptr, cu_seqlens_q_ptr,
        seq_lens_ptr, out_ptr, scale_log2, num_seqs,
        stride_q_token, stride_q_head, stride_cache_block, stride_cache_slot, stride_cache_head,
        stride_table_seq, stride_out_token, stride_out_head,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    # The last sequence whose first tile is numbered at or before this program.
    lo = pid * 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        at_or_before = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid <= pid
        lo = tl.where(at_or_before, mid, lo)
        hi = tl.where(at_or_before, hi, mid - 1)
    seq = lo
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len

    # Row r is query tile * BLOCK_Q + r // GROUP of the sequence, head r % GROUP of the KV head's group.
    offs_m = tl.arange(0, BLOCK_M)
    token = tile * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    mask_m = (offs_m < BLOCK_Q * GROUP) & (token < q_len)
    offs_d = tl.arange(0, DIM_PAD)
    mask_d = offs_d < HEAD_DIM
    q = tl.load(q_ptr + (q_start + token)[:, None] * stride_q_token + head[:, None] * stride_q_head + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    q_pos = context_len + token

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    table = block_tables_ptr + seq * stride_table_seq
    # The tile's last query sees no further than its own position; keys up to its first query are
    # visible to every row, which for a long prompt or a decode is nearly all of them.
    end = tl.minimum(seq_len, context_len + tl.minimum((tile + 1) * BLOCK_Q, q_len))
    unmasked_end = tl.maximum(context_len + tile * BLOCK_Q + 1, 0) // BLOCK_N * BLOCK_N
    for start_n in range(0, unmasked_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table, offs_n, offs_n < unmasked_end, kv_head, offs_d,
                            mask_d, stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE,
                            k_scales_ptr, v_scales_ptr)
        m, denom, acc = online_softmax_step(q, k, v, None, m, denom, acc, scale_log2, PRECISION)
    for start_n in range(unmasked_end, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, table, offs_n, mask_n, kv_head, offs_d, mask_d,
                            stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE, k_scales_ptr,
                            v_scales_ptr)
        visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])  # causal
        m, denom, acc = online_softmax_step(q, k, v, visible, m, denom, acc, scale_log2, PRECISION)

    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]  # no key (a padding row): zeros
    tl.store(out_ptr + (q_start + token)[:, None] * stride_out_token + head[:, None] * stride_out_head
             + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


# (BLOCK_M, BLOCK_N, warps) for 16-bit inputs by architecture, largest first: on Hopper 64 x 64 on 4
# warps, the fastest of eight tilings on an H100 (BENCHMARKS.md); before it, the largest tiles that
# the compiler fits in registers without spilling (ptxas's report, `kernels/aot.py`, head dims 64 to
# 128, both block sizes, the int8 cache). On an RTX 30/40 or an L4, 32 x 32 tiles on 8 warps spill
# (ptxas gives them 80 registers a thread there); on 4 warps they do not.
_TILINGS = {90: [(64, 64, 4), (64, 32, 4), (32, 32, 4), (16, 16, 4)],
            86: [(64, 32, 8), (32, 32, 4), (16, 16, 4)],
            80: [(64, 32, 8), (32, 32, 8), (16, 16, 4)],
            75: [(64, 16, 8), (32, 16, 8), (16, 16, 4)]}


# Triton's software-pipeline stages: at 2, the next tile's K and V are copied in while this one is used.
# The gather through the block table takes stages of its own: a second tile in flight needs 5, and
# three buffers each of K and V (BENCHMARKS.md, "Two tiles ahead takes five stages"). 2 on every GPU
# so far, the shared memory that `shared_bytes_estimate` counts; `minillm bench attention --tilings
# MxNxWxS` times others.
STAGES = 2


def ragged_tiles(target: GPUSpec | None, group: int, max_query_len: int, dim_pad: int,
                 element_size: int) -> tuple[int, int, int]:
    """(BLOCK_M rows, BLOCK_N keys, warps) of a launch whose sequences bring at most max_query_len
    queries each: rows enough for them (times the group), up to 64, where a block's shared memory
    holds the rows and tiles of K and V that size; fewer for short queries, so that decode and
    verification rows waste little of a tile. fp32 runs on a GPU for exactness (tests, exercise
    checks), not speed: 32 x 32 at most."""
    group_pad = triton.next_power_of_2(group)
    rows = max(16, group_pad, min(64, triton.next_power_of_2(max_query_len * group)))
    if target is None:
        return rows, 64, 4  # the interpreter runs each program in Python: fewer, bigger tiles are faster there
    if element_size == 4:
        sizes = [(32, 32, 4), (16, 16, 4)]
    else:
        sizes = _TILINGS[max(c for c in _TILINGS if c <= target.capability)]
    candidates = [t for t in sizes if group_pad <= t[0] <= rows] or [(group_pad, 16, 4)]
    return first_fitting(target, candidates, lambda t: shared_bytes_estimate(target, t[0] + 2 * t[1], dim_pad,
                                                                          element_size))


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                            scale: float, max_query_len: int | None = None, *, k_scales: torch.Tensor | None = None,
                            v_scales: torch.Tensor | None = None) -> torch.Tensor:
    """q: [total_tokens, heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim];
    cu_seqlens_q: [num_seqs + 1] int32; max_query_len: at most how many queries a sequence brings
    (it picks the tiles, never the grid; the engine passes its bound, sparing a read from the GPU);
    k_scales, v_scales: an int8 cache's scales, [num_blocks, block_size, kv_heads]."""
    total_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if max_query_len is None:
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    group = num_heads // num_kv_heads
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    block_m, block_n, warps = ragged_tiles(launch_target(q.device), group, max_query_len, dim_pad, q.element_size())
    block_q = block_m // group
    out = torch.empty_like(q)
    check_kv_layout(k_cache, v_cache, k_scales, v_scales)
    assert q.stride(2) == 1
    _ragged_attention_kernel[(total_tokens // block_q + num_seqs, num_kv_heads)](
        q, k_cache, v_cache, k_scales, v_scales, block_tables, cu_seqlens_q, seq_lens, out, scale * LOG2E.value,
        num_seqs, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, DIM_PAD=dim_pad, BLOCK_SIZE=block_size, BLOCK_M=block_m,
        BLOCK_Q=block_q, BLOCK_N=block_n, PRECISION=dot_precision(q.dtype), num_warps=warps, num_stages=STAGES)
    return out
