"""Paged decode attention, split-KV (Flash-Decoding), in Triton (reference:
`reference.paged_decode_attention_ref`).

At decode every sequence has a single query, so one program per (sequence, head) would leave most
of a GPU idle on a small batch with long contexts. Split-KV cuts each sequence's context into
partitions that run in parallel; each partition returns its partial output with the log-sum-exp of
its scores, and a second kernel merges the partitions exactly: a softmax over the partitions' lse
weights their outputs.

Grouped-query attention: a program handles all query heads that share one KV head, so each K/V
block is read from memory once per group instead of once per query head. Decode reads the whole KV
cache every step and is bound by memory bandwidth, which is why that matters; it is also why an int8
cache pays: half the bytes to read, dequantized in registers as each tile is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minillm.kernels import check_kv_layout, dot_precision
from minillm.kernels.attention_reference import PARTITION_SIZE, default_partition
from minillm.kernels.targets import GPUSpec, first_fitting, launch_target, shared_bytes_estimate
from minillm.kernels.tiles import LOG2E, load_kv_tile, online_softmax_step


# Sizes that change from step to step are not specialized on (Triton otherwise compiles a variant for
# each value that is 1 or a multiple of 16): a step must never wait for a compile.
@triton.jit(do_not_specialize=["stride_table_seq", "stride_out_seq", "stride_out_head", "stride_lse_seq",
                               "stride_lse_head"])
def _decode_partition_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, block_tables_ptr, seq_lens_ptr, out_ptr,
        lse_ptr, scale,
        stride_q_seq, stride_q_head, stride_cache_block, stride_cache_slot, stride_cache_head,
        stride_table_seq, stride_out_seq, stride_out_head, stride_out_part, stride_lse_seq, stride_lse_head,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, PARTITION: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, DIM_PAD)
    offs_t = tl.arange(0, TILE_N)
    heads = kv_head * GROUP + offs_g
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the scores
    denom = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp(score - m)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    end = tl.minimum(seq_len, (part + 1) * PARTITION)
    # Tiles of TILE_N tokens that may span several blocks: each token finds its block through the
    # table, so a tile is one gathered load, however small the blocks.
    for start in range(part * PARTITION, end, TILE_N):
        pos = start + offs_t
        mask_t = pos < end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_table_seq, pos, mask_t,
                            kv_head, offs_d, mask_d, stride_cache_block, stride_cache_slot, stride_cache_head,
                            BLOCK_SIZE, k_scales_ptr, v_scales_ptr)
        m, denom, acc = online_softmax_step(q, k, v, mask_t[None, :], m, denom, acc, scale * LOG2E, PRECISION)

    # A partition past the end of a short sequence saw no key: it reports lse = -inf and weighs nothing.
    # m is in base 2 (tiles.online_softmax_step); lse goes out in base e, as the reference's.
    has_keys = denom > 0
    out = acc / tl.where(has_keys, denom, 1.0)[:, None]
    lse = tl.where(has_keys, (m + tl.log2(tl.where(has_keys, denom, 1.0))) / LOG2E, float("-inf"))
    tl.store(out_ptr + seq * stride_out_seq + heads[:, None] * stride_out_head + part * stride_out_part
             + offs_d[None, :], out, mask=mask_g[:, None] & mask_d[None, :])
    tl.store(lse_ptr + seq * stride_lse_seq + heads * stride_lse_head + part, lse, mask=mask_g)


@triton.jit(do_not_specialize=["stride_part_seq", "stride_part_head", "stride_lse_seq", "stride_lse_head",
                               "num_parts"])
def _merge_partitions_kernel(
        part_out_ptr, lse_ptr, out_ptr, stride_part_seq, stride_part_head, stride_part_part,
        stride_lse_seq, stride_lse_head, stride_out_seq, stride_out_head, num_parts,
        PARTS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_p = tl.arange(0, PARTS_PAD)
    offs_d = tl.arange(0, DIM_PAD)
    mask_p = offs_p < num_parts
    mask_d = offs_d < HEAD_DIM
    lse = tl.load(lse_ptr + seq * stride_lse_seq + head * stride_lse_head + offs_p, mask=mask_p,
                  other=float("-inf"))
    # Partition 0 has keys unless the sequence has none (a padding row of a CUDA graph's batch):
    # that row's weights are all 0, and so is its output.
    top = tl.max(lse, 0)
    weights = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))
    total = tl.sum(weights, 0)
    weights = weights / tl.where(total > 0, total, 1.0)
    parts = tl.load(part_out_ptr + seq * stride_part_seq + head * stride_part_head
                    + offs_p[:, None] * stride_part_part + offs_d[None, :],
                    mask=mask_p[:, None] & mask_d[None, :], other=0.0)
    out = tl.sum(parts * weights[:, None], 0)
    tl.store(out_ptr + seq * stride_out_seq + head * stride_out_head + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=mask_d)


def decode_tile(target: GPUSpec | None, partition_size: int, group_pad: int, dim_pad: int,
                element_size: int) -> int:
    """Tokens per tile: 64 where the partition allows and a block's shared memory holds the queries
    and tiles of K and V that long (enough work per load to keep memory busy); fewer otherwise.
    Before Hopper at most 32: 64-token tiles spilled registers there (584-704 bytes a thread on an
    A100, 800-1,752 on a T4, by ptxas's report through `kernels/aot.py`), where on an H100, which
    reads K and V at the copy bandwidth with them, they spill 80."""
    tiles = [n for n in (64, 32, 16) if partition_size % n == 0]
    if target is None:
        return tiles[0]
    if target.capability < 90:
        tiles = [n for n in tiles if n <= 32]
    return first_fitting(target, tiles, lambda n: shared_bytes_estimate(target, group_pad + 2 * n, dim_pad,
                                                                     element_size))


@dataclass(frozen=True)
class DecodeLaunch:
    """How the split-KV pass is launched for a batch: one program per (sequence, KV head, partition),
    each walking its partition of `partition_size` context tokens in tiles of `tile_n`."""
    grid: tuple[int, int, int]  # (sequences, KV heads, partitions)
    partition_size: int
    tile_n: int
    group_pad: int  # query heads per KV head, padded for tl.dot
    dim_pad: int  # head_dim, padded likewise
    num_warps: int  # 8 on a T4, where 4 spill registers even with 32-token tiles

    @property
    def num_programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


def decode_launch(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, max_seq_len: int,
                  partition_size: int = PARTITION_SIZE, target: GPUSpec | None = None,
                  element_size: int = 2) -> DecodeLaunch:
    """The launch `paged_decode_attention` makes: as many partitions as the longest sequence needs
    (every sequence gets that many; those past its end return at once), whatever the batch size.
    target: the GPU (None: Triton's interpreter); element_size: bytes per element of q."""
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    group_pad = max(16, triton.next_power_of_2(num_heads // num_kv_heads))
    tile_n = decode_tile(target, partition_size, group_pad, dim_pad, element_size)
    num_parts = triton.cdiv(max_seq_len, partition_size)
    warps = 8 if target is not None and target.capability < 80 else 4
    return DecodeLaunch((num_seqs, num_kv_heads, num_parts), partition_size, tile_n, group_pad, dim_pad, warps)


def paged_decode_partitions(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                            max_seq_len: int | None = None, partition_size: int | None = None, *,
                            k_scales: torch.Tensor | None = None,
                            v_scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-KV pass alone (reference: `reference.paged_decode_partitions_ref`): part_out
    [num_seqs, heads, num_parts, head_dim], each partition's softmax-weighted values in fp32 (0 where
    the partition holds no key), and lse [num_seqs, heads, num_parts], the log-sum-exp of its scores
    (-inf where it holds none). `merge_partitions` turns them into the attention output."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if partition_size is None:
        partition_size = default_partition(block_size)
    if partition_size < 16 or partition_size % block_size or partition_size % 16:
        raise ValueError(f"partition_size must be a positive multiple of block_size={block_size} and of 16 (the "
                         f"smallest tile of keys tl.dot takes), got {partition_size}")
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    launch = decode_launch(num_seqs, num_heads, num_kv_heads, head_dim, max_seq_len, partition_size,
                           launch_target(q.device), q.element_size())
    num_parts = launch.grid[2]
    part_out = torch.empty((num_seqs, num_heads, num_parts, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.empty((num_seqs, num_heads, num_parts), dtype=torch.float32, device=q.device)
    check_kv_layout(k_cache, v_cache, k_scales, v_scales)
    assert q.stride(2) == 1
    _decode_partition_kernel[launch.grid](
        q, k_cache, v_cache, k_scales, v_scales, block_tables, seq_lens, part_out, lse, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), part_out.stride(0), part_out.stride(1), part_out.stride(2),
        lse.stride(0), lse.stride(1),
        GROUP=num_heads // num_kv_heads, GROUP_PAD=launch.group_pad, HEAD_DIM=head_dim, DIM_PAD=launch.dim_pad,
        BLOCK_SIZE=block_size, PARTITION=partition_size, TILE_N=launch.tile_n,
        PRECISION=dot_precision(q.dtype), num_warps=launch.num_warps)
    return part_out, lse


def merge_partitions(part_out: torch.Tensor, lse: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The partitions of `paged_decode_partitions` merged exactly: [num_seqs, heads, head_dim] in dtype.
    A row whose partitions all hold no key (a padding row) gives zeros."""
    num_seqs, num_heads, num_parts, head_dim = part_out.shape
    out = torch.empty((num_seqs, num_heads, head_dim), dtype=dtype, device=part_out.device)
    _merge_partitions_kernel[(num_seqs, num_heads)](
        part_out, lse, out, part_out.stride(0), part_out.stride(1), part_out.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1), num_parts,
        PARTS_PAD=triton.next_power_of_2(num_parts), HEAD_DIM=head_dim,
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)))
    return out


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           max_seq_len: int | None = None, partition_size: int | None = None, *,
                           k_scales: torch.Tensor | None = None, v_scales: torch.Tensor | None = None) -> torch.Tensor:
    """q: [num_seqs, heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim].
    max_seq_len, if the caller knows it, saves reading seq_lens back from the device;
    partition_size: context tokens per split, a multiple of the block size and of 16 (by default
    `default_partition`: 512, or one block where a block is longer);
    k_scales, v_scales: an int8 cache's scales, [num_blocks, block_size, kv_heads]."""
    part_out, lse = paged_decode_partitions(q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len,
                                            partition_size, k_scales=k_scales, v_scales=v_scales)
    return merge_partitions(part_out, lse, q.dtype)
