"""Rotary embedding of a step's queries and keys in one launch (reference:
`layer_reference.rotary_embedding_ref`), reading cos and sin from a table built once per model.

One program per token rotates all its query heads and all its key heads: channel i pairs with
channel i + head_dim / 2 (the "rotate half" layout of Llama's checkpoints). The reference builds
cos and sin for the step's positions (about seven kernels per step) and rotates q and k with
several elementwise kernels each. Each product and the sum are rounded to the model's dtype where
the reference's own operations round them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_head, num_heads, cos, sin, HEADS_PAD: tl.constexpr,
                  HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    """Rotate [num_heads, 2 * HALF] at src_ptr (heads stride_head apart) into dst_ptr (contiguous)."""
    heads = tl.arange(0, HEADS_PAD)[:, None]
    offs = tl.arange(0, HALF_PAD)[None, :]
    mask = (heads < num_heads) & (offs < HALF)
    x1 = tl.load(src_ptr + heads * stride_head + offs, mask=mask, other=0.0)
    x2 = tl.load(src_ptr + heads * stride_head + HALF + offs, mask=mask, other=0.0)
    dtype = x1.dtype
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    # out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin; each product rounded, then the sum.
    out1 = (a1 * cos).to(dtype).to(tl.float32) + (-a2 * sin).to(dtype).to(tl.float32)
    out2 = (a2 * cos).to(dtype).to(tl.float32) + (a1 * sin).to(dtype).to(tl.float32)
    tl.store(dst_ptr + heads * (2 * HALF) + offs, out1.to(dtype), mask=mask)
    tl.store(dst_ptr + heads * (2 * HALF) + HALF + offs, out2.to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(positions_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cache_ptr, stride_q_token, stride_q_head,
                   stride_k_token, stride_k_head, num_heads, num_kv_heads, HEADS_PAD: tl.constexpr,
                   KV_HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs = tl.arange(0, HALF_PAD)[None, :]
    # The table's row: cos of each frequency, then sin, already in the model's dtype.
    cos = tl.load(cache_ptr + pos * 2 * HALF + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * 2 * HALF + HALF + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + token * stride_q_token, q_out_ptr + token * num_heads * 2 * HALF, stride_q_head,
                  num_heads, cos, sin, HEADS_PAD, HALF, HALF_PAD)
    _rotate_heads(k_ptr + token * stride_k_token, k_out_ptr + token * num_kv_heads * 2 * HALF, stride_k_head,
                  num_kv_heads, cos, sin, KV_HEADS_PAD, HALF, HALF_PAD)


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] (views of the qkv projection's
    output are fine) rotated by their positions' angles; cos_sin_cache [max_positions, head_dim]:
    each row cos then sin of the head_dim / 2 frequencies, in q's dtype."""
    tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos_sin_cache.is_contiguous()
    q_out = torch.empty(tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    k_out = torch.empty(tokens, num_kv_heads, head_dim, dtype=k.dtype, device=k.device)
    half = head_dim // 2
    _rotary_kernel[(tokens,)](positions, q, k, q_out, k_out, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0),
                              k.stride(1), num_heads, num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_heads),
                              KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads), HALF=half,
                              HALF_PAD=triton.next_power_of_2(half), num_warps=4)
    return q_out, k_out
