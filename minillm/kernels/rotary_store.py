"""Rotary embedding fused with the KV store, one launch per layer (reference:
`layer_reference.fused_rotary_store_kvcache_ref`): each token's queries and keys are rotated by its
position's row of the model's cos/sin table, the query written out for attention, and the rotated
key and the value written to the token's slot of the paged pool (nothing for slot -1, a padding
row; quantized into an int8 pool). Qwen3's per-head q and k norm folds into the same pass.

Apart, these are two launches, or four with Qwen3's norms, and the rotated key makes a round trip
through memory between them. The paged attention backend calls this op in place of the
rotate-then-store pair; the rotated key itself is not returned, since attention reads keys from
the pool.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels import check_kv_layout
from minillm.kernels.rotary import cos_sin, load_heads, rotate, store_heads
from minillm.kernels.store_kv import store_values


@triton.jit
def _fused_rotary_store_kvcache_kernel(
        positions_ptr, q_ptr, k_ptr, v_ptr, q_out_ptr, cos_sin_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr,
        v_scales_ptr, slot_mapping_ptr, q_norm_ptr, k_norm_ptr, eps, stride_q_token, stride_q_head, stride_k_token,
        stride_k_head, stride_v_token, stride_v_head, num_heads, NUM_KV_HEADS: tl.constexpr,
        HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, HALF: tl.constexpr, DIM_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = cos_sin(cos_sin_ptr, tl.load(positions_ptr + token).to(tl.int64), HALF, DIM_PAD)
    q, q_partner = load_heads(q_ptr + token * stride_q_token, stride_q_head, num_heads, q_norm_ptr, eps, HEADS_PAD,
                              HALF, DIM_PAD)
    store_heads(q_out_ptr + token * num_heads * 2 * HALF, rotate(q, q_partner, cos, sin), num_heads, HEADS_PAD,
                HALF, DIM_PAD)
    k, k_partner = load_heads(k_ptr + token * stride_k_token, stride_k_head, NUM_KV_HEADS, k_norm_ptr, eps,
                              KV_HEADS_PAD, HALF, DIM_PAD)
    # The pool's layout, as store_kv's: [slot, kv head, head_dim], one scale per (slot, kv head).
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, KV_HEADS_PAD)
    offs_d = tl.arange(0, DIM_PAD)
    mask_h = (offs_h < NUM_KV_HEADS) & (tl.full([KV_HEADS_PAD], 0, tl.int64) + slot >= 0)
    mask = mask_h[:, None] & (offs_d < 2 * HALF)[None, :]
    v = tl.load(v_ptr + token * stride_v_token + offs_h[:, None] * stride_v_head + offs_d[None, :], mask=mask,
                other=0.0)
    offs = offs_h[:, None] * 2 * HALF + offs_d[None, :]
    cache_row = slot * NUM_KV_HEADS * 2 * HALF
    scale_offs = slot * NUM_KV_HEADS + offs_h
    store_values(rotate(k, k_partner, cos, sin), k_cache_ptr + cache_row, k_scales_ptr, offs, mask, scale_offs, mask_h)
    store_values(v, v_cache_ptr + cache_row, v_scales_ptr, offs, mask, scale_offs, mask_h)


def fused_rotary_store_kvcache(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               slot_mapping: torch.Tensor, *, q_norm_weight: torch.Tensor | None = None,
                               k_norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                               k_scales: torch.Tensor | None = None,
                               v_scales: torch.Tensor | None = None) -> torch.Tensor:
    """q [tokens, heads, head_dim], k and v [tokens, kv_heads, head_dim] (views of the qkv projection's
    output are fine), at positions [tokens]; cos_sin_cache as rotary_embedding's; caches and scales
    as store_kvcache's; q_norm_weight and k_norm_weight [head_dim]: each head RMS-normalised first
    (with eps). Returns q rotated, [tokens, heads, head_dim]; k rotated and v are in their slots."""
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight come together (Qwen3 normalises both), got only "
                         f"{'q_norm_weight' if k_norm_weight is None else 'k_norm_weight'}")
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and cos_sin_cache.is_contiguous()
    check_kv_layout(k_cache, v_cache, k_scales, v_scales)
    q_out = torch.empty(tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    _fused_rotary_store_kvcache_kernel[(tokens,)](
        positions, q, k, v, q_out, cos_sin_cache, k_cache, v_cache, k_scales, v_scales, slot_mapping, q_norm_weight,
        k_norm_weight, eps, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), num_heads,
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_heads),
        KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads), HALF=head_dim // 2, DIM_PAD=triton.next_power_of_2(head_dim),
        num_warps=4)
    return q_out
