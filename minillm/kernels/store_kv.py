"""Write this step's K and V into the paged pool through a slot mapping (reference:
`reference.store_kvcache_ref`). One program per token copies that token's K and V, all KV heads at
once, to the slot the block manager gave it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kvcache_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                          stride_k_token, stride_v_token, stride_cache_slot,
                          ROW: tl.constexpr, ROW_PAD: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs = tl.arange(0, ROW_PAD)
    mask = (offs < ROW) & (tl.full([ROW_PAD], 0, tl.int64) + slot >= 0)
    k = tl.load(k_ptr + token * stride_k_token + offs, mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + offs, mask=mask)
    tl.store(k_cache_ptr + slot * stride_cache_slot + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_cache_slot + offs, v, mask=mask)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """k, v: [tokens, kv_heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim]."""
    num_tokens, num_kv_heads, head_dim = k.shape
    row = num_kv_heads * head_dim
    # One token's heads must be one contiguous row on both sides, which is how the model and the
    # pool lay them out.
    assert k.stride(1) == head_dim and k.stride(2) == 1 and v.stride(1) == head_dim and v.stride(2) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    _store_kvcache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0), row,
        ROW=row, ROW_PAD=triton.next_power_of_2(row))
