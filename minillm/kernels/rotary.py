"""Rotary embedding of a step's queries and keys in one launch (reference:
`layer_reference.rotary_embedding_ref`), reading cos and sin from a table built once per model.

One program per token rotates all its query heads and all its key heads: channel i pairs with
channel i + head_dim / 2 (the "rotate half" layout of Llama's checkpoints). Each head is one row of
a [heads, head_dim] tile, loaded beside its partner channels, so that a whole head is at hand for
what may come with the rotation (Qwen3's per-head norm before it, the KV store after it:
`rotary_store.py`). The reference builds cos and sin for the step's positions (about seven kernels
per step) and rotates q and k with several elementwise kernels each. Each product and the sum are
rounded to the model's dtype where the reference's own operations round them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minillm.kernels.rms_norm import scale_rows


@triton.jit
def cos_sin(cache_ptr, pos, HALF: tl.constexpr, DIM_PAD: tl.constexpr):
    """Position pos's row of the table spread over a head's channels, [1, DIM_PAD] in fp32: the cos
    of channel d's frequency (d mod HALF), and its sin negated on the first half (rotate half: the
    first half takes -partner * sin, the second +partner * sin)."""
    offs = tl.arange(0, DIM_PAD)[None, :]
    mask = offs < 2 * HALF
    row = cache_ptr + pos * 2 * HALF + offs % HALF
    cos = tl.load(row, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF, mask=mask, other=0.0).to(tl.float32)
    return cos, tl.where(offs < HALF, -sin, sin)


@triton.jit
def load_heads(src_ptr, stride_head, num_heads, norm_ptr, eps, HEADS_PAD: tl.constexpr, HALF: tl.constexpr,
               DIM_PAD: tl.constexpr):
    """The [HEADS_PAD, DIM_PAD] tile of num_heads heads at src_ptr (stride_head apart), and the tile of
    each channel's partner (d + HALF mod head_dim), in the model's dtype. With norm_ptr, each head
    is first RMS-normalised and weighted by norm_ptr's head_dim weights (Qwen3's q and k norm)."""
    heads = tl.arange(0, HEADS_PAD)[:, None]
    offs = tl.arange(0, DIM_PAD)[None, :]
    mask = (heads < num_heads) & (offs < 2 * HALF)
    partner = (offs + HALF) % (2 * HALF)
    x = tl.load(src_ptr + heads * stride_head + offs, mask=mask, other=0.0)
    p = tl.load(src_ptr + heads * stride_head + partner, mask=mask, other=0.0)
    if norm_ptr is not None:
        x32 = x.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(x32 * x32, axis=1) / (2 * HALF) + eps)[:, None]  # a head's, for its partners too
        x = scale_rows(x, inv_rms, tl.load(norm_ptr + offs, mask=offs < 2 * HALF, other=0.0))
        p = scale_rows(p, inv_rms, tl.load(norm_ptr + partner, mask=offs < 2 * HALF, other=0.0))
    return x, p


@triton.jit
def rotate(x, partner, cos, sin):
    """x cos + partner sin (sin signed by cos_sin), each product rounded to x's dtype, then the sum."""
    dtype = x.dtype
    return ((x.to(tl.float32) * cos).to(dtype).to(tl.float32)
            + (partner.to(tl.float32) * sin).to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def store_heads(dst_ptr, x, num_heads, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, DIM_PAD: tl.constexpr):
    """A [HEADS_PAD, DIM_PAD] tile of num_heads heads to contiguous [num_heads, head_dim] at dst_ptr."""
    heads = tl.arange(0, HEADS_PAD)[:, None]
    offs = tl.arange(0, DIM_PAD)[None, :]
    tl.store(dst_ptr + heads * (2 * HALF) + offs, x, mask=(heads < num_heads) & (offs < 2 * HALF))


@triton.jit
def _rotary_kernel(positions_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cache_ptr, stride_q_token, stride_q_head,
                   stride_k_token, stride_k_head, num_heads, num_kv_heads, HEADS_PAD: tl.constexpr,
                   KV_HEADS_PAD: tl.constexpr, HALF: tl.constexpr, DIM_PAD: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = cos_sin(cache_ptr, tl.load(positions_ptr + token).to(tl.int64), HALF, DIM_PAD)
    q, q_partner = load_heads(q_ptr + token * stride_q_token, stride_q_head, num_heads, None, 0.0, HEADS_PAD, HALF,
                              DIM_PAD)
    store_heads(q_out_ptr + token * num_heads * 2 * HALF, rotate(q, q_partner, cos, sin), num_heads, HEADS_PAD,
                HALF, DIM_PAD)
    k, k_partner = load_heads(k_ptr + token * stride_k_token, stride_k_head, num_kv_heads, None, 0.0, KV_HEADS_PAD,
                              HALF, DIM_PAD)
    store_heads(k_out_ptr + token * num_kv_heads * 2 * HALF, rotate(k, k_partner, cos, sin), num_kv_heads,
                KV_HEADS_PAD, HALF, DIM_PAD)


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
    _rotary_kernel[(tokens,)](positions, q, k, q_out, k_out, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0),
                              k.stride(1), num_heads, num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_heads),
                              KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads), HALF=head_dim // 2,
                              DIM_PAD=triton.next_power_of_2(head_dim), num_warps=4)
    return q_out, k_out
