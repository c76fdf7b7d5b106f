"""Write this step's K and V into the paged pool through a slot mapping (reference:
`reference.store_kvcache_ref`). One program per token copies that token's K and V, all KV heads at
once, to the slot the block manager gave it; into an int8 pool it writes each head quantized, and
the head's scale (max|x| / 127 over its head_dim values) into the scale pool beside it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels import check_kv_layout


@triton.jit
def store_values(x, cache_ptr, scales_ptr, offs, mask, scale_offs, mask_h):
    """One token's K (or V), the [kv heads, head_dim] tile x, to cache_ptr + offs; into an int8 pool
    quantized, a scale per head (row of x) to scales_ptr + scale_offs."""
    if scales_ptr is not None:
        x = x.to(tl.float32)
        scales = tl.maximum(tl.max(tl.abs(x), 1), 1e-8) / 127  # as quant.int8.quantize_int8, a row per head
        x = x / scales[:, None]
        # Round to nearest; ties go away from zero here and to even in torch.round, the only difference.
        x = tl.where(x >= 0, tl.floor(x + 0.5), tl.ceil(x - 0.5))
        x = tl.minimum(tl.maximum(x, -127.0), 127.0).to(tl.int8)
        tl.store(scales_ptr + scale_offs, scales, mask=mask_h)
    tl.store(cache_ptr + offs, x, mask=mask)


@triton.jit
def _store_heads(src_ptr, cache_ptr, scales_ptr, offs, mask, scale_offs, mask_h):
    """One token's K (or V): the [kv heads, head_dim] tile at src_ptr + offs, to cache_ptr + offs."""
    store_values(tl.load(src_ptr + offs, mask=mask, other=0.0), cache_ptr, scales_ptr, offs, mask, scale_offs,
                 mask_h)


@triton.jit
def _store_kvcache_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, slot_mapping_ptr,
                          stride_k_token, stride_v_token, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                          HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, DIM_PAD)
    mask_h = (offs_h < NUM_KV_HEADS) & (tl.full([HEADS_PAD], 0, tl.int64) + slot >= 0)
    mask = mask_h[:, None] & (offs_d < HEAD_DIM)[None, :]
    offs = offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    cache_row = slot * NUM_KV_HEADS * HEAD_DIM
    scale_offs = slot * NUM_KV_HEADS + offs_h
    _store_heads(k_ptr + token * stride_k_token, k_cache_ptr + cache_row, k_scales_ptr, offs, mask, scale_offs,
                 mask_h)
    _store_heads(v_ptr + token * stride_v_token, v_cache_ptr + cache_row, v_scales_ptr, offs, mask, scale_offs,
                 mask_h)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, *, k_scales: torch.Tensor | None = None,
                  v_scales: torch.Tensor | None = None) -> None:
    """k, v: [tokens, kv_heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim];
    k_scales, v_scales: an int8 cache's scales, [num_blocks, block_size, kv_heads]."""
    num_tokens, num_kv_heads, head_dim = k.shape
    # One token's heads must be one contiguous row on both sides, which is how the model and the
    # pool lay them out.
    assert k.stride(1) == head_dim and k.stride(2) == 1 and v.stride(1) == head_dim and v.stride(2) == 1
    check_kv_layout(k_cache, v_cache, k_scales, v_scales)
    _store_kvcache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, k_scales, v_scales, slot_mapping, k.stride(0), v.stride(0),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim))
