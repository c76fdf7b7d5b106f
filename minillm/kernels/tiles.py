"""The two steps every paged attention kernel here repeats, as Triton device functions: gather a
tile of K and V through a block table, and fold one tile of scores into a running softmax."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, table_ptr, pos, mask, kv_head, offs_d, mask_d,
                 stride_cache_block, stride_cache_slot, stride_cache_head, BLOCK_SIZE: tl.constexpr,
                 k_scales_ptr=None, v_scales_ptr=None):
    """K and V of the tokens at positions `pos` of one sequence (table_ptr: its block table row):
    token p lives in block table[p // BLOCK_SIZE], slot p % BLOCK_SIZE. Masked tokens read as 0.
    An int8 cache comes with its scales (laid out as the cache without head_dim, so that a row's
    scale sits at the row's offset / head_dim): K and V are then returned dequantized, in fp32."""
    block_ids = tl.load(table_ptr + pos // BLOCK_SIZE, mask=mask, other=0).to(tl.int64)
    rows = block_ids * stride_cache_block + (pos % BLOCK_SIZE) * stride_cache_slot + kv_head * stride_cache_head
    offs = rows[:, None] + offs_d[None, :]
    kv_mask = mask[:, None] & mask_d[None, :]
    k = tl.load(k_cache_ptr + offs, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + offs, mask=kv_mask, other=0.0)
    if k_scales_ptr is not None:
        scale_offs = rows // stride_cache_head
        k = k.to(tl.float32) * tl.load(k_scales_ptr + scale_offs, mask=mask, other=0.0)[:, None]
        v = v.to(tl.float32) * tl.load(v_scales_ptr + scale_offs, mask=mask, other=0.0)[:, None]
    return k, v


# exp(x) = 2 ** (x * log2(e)): the kernels multiply the scores by scale * LOG2E once and use exp2,
# which the GPU computes in one instruction (exp is exp2 after a multiply). A constexpr, so that
# kernels may read it (Triton lets them read no other global).
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def online_softmax_step(q, k, v, visible, m, denom, acc, scale_log2, PRECISION: tl.constexpr):
    """Attend rows of q to one tile of keys without ever holding all the scores: m is each row's
    running max, denom its running sum of 2 ** (score - m), acc its running weighted sum of values,
    the scores being q.k * scale_log2 (the softmax scale times LOG2E: base 2 throughout). A new max
    rescales what was summed before by 2 ** (old max - new max). K and V are taken in q's dtype (a
    dequantized int8 tile comes in fp32). visible=None: every key of the tile is visible to every
    query, and no mask is applied."""
    k = k.to(q.dtype)
    v = v.to(q.dtype)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if visible is not None:
        scores = tl.where(visible, scores, float("-inf"))
    # The scale is positive, so the row's largest score scaled is the largest scaled score; scaling
    # each score inside the exponent's argument makes it one multiply-add with the subtraction.
    m_new = tl.maximum(m, tl.max(scores, 1) * scale_log2)
    p = tl.exp2(scores * scale_log2 - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    denom = denom * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, denom, acc
