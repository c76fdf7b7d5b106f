"""The one-row kernel of the quantized matmuls' decode path (`quant_gemv.py`): one row of x against
the whole weight on the plain ALUs, where an int4 weight costs a shift, one bitwise operation and
one fp32 multiply-add (with 16-bit inputs, two weights share each packed instruction instead:
`quant_half2.py`), and an int8 weight one bitwise operation and a multiply-add. Each thread sums
its own products, and the rows are reduced across threads once, after the loop.

An int4 tile is SUBTILES sub-tiles side by side along the inputs, each lying in one group (its
SUB_K inputs divide the group size), so that a tile's rows can be read in runs longer than one
group's 64 bytes: the tile's words are a [BLOCK_N, SUBTILES, SUB_K // 8] block, and each sub-tile
takes its own scale and zero point.
"""

from __future__ import annotations

import triton
import triton.language as tl

from minillm.kernels.quant_half2 import LEVEL_UNIT, half2_pairs, input_pairs, word_dots_half2
from minillm.kernels.quant_tiles import finish_rows, float_levels, nibble_inputs, word_level


@triton.jit
def _int4_row_tile(w_ptr, x_ptr, scales_ptr, zeros_ptr, rows, group_rows, words, mask_n, k0,
                   GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, HALF2: tl.constexpr):
    """The int4 one-row kernel's loads for the tile at input k0: its int32 words [BLOCK_N, SUBTILES,
    words a sub-tile] (rows: each row's first word [BLOCK_N, 1]; words: the tile's [SUBTILES,
    words a sub-tile]), its inputs, and its rows' scales and zero points [BLOCK_N, SUBTILES]
    (group_rows: each row's first [BLOCK_N, 1]). HALF2: the inputs as `input_pairs`, each scale and
    zero point as one `half2_pairs`; else the inputs, scales and zero points in fp32."""
    SUBTILES: tl.constexpr = BLOCK_K // SUB_K
    # Loaded as rows of BLOCK_K // 8 words, then split into sub-tiles: as a 3D load, Triton may give
    # a thread one row's words of every sub-tile rather than several rows' of one (triton 3.6 did).
    w = tl.load(w_ptr + rows + k0 // 8 + tl.arange(0, BLOCK_K // 8)[None, :], mask=mask_n[:, None], other=0)
    w = tl.reshape(w, [w.shape[0], SUBTILES, SUB_K // 8])
    groups = group_rows + ((k0 + tl.arange(0, SUBTILES) * SUB_K) // GROUP_SIZE)[None, :]
    scale = tl.load(scales_ptr + groups, mask=mask_n[:, None], other=0.0)
    zero = tl.load(zeros_ptr + groups, mask=mask_n[:, None], other=0.0)
    if HALF2:
        return w, input_pairs(x_ptr, k0, words), half2_pairs(scale, zero)
    else:
        return w, tl.load(x_ptr + k0 + tl.arange(0, BLOCK_K)).to(tl.float32), (scale.to(tl.float32),
                                                                                zero.to(tl.float32))


@triton.jit
def _int8_row_tile(w_ptr, x_ptr, rows, mask_n, k0, end, BLOCK_K: tl.constexpr):
    """The int8 one-row kernel's loads for the tile at input k0, as stored: levels and inputs (none
    at or past `end`, the slice's end)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask_k = offs_k < end
    q = tl.load(w_ptr + rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0)
    return q, tl.load(x_ptr + offs_k, mask=mask_k, other=0.0)


@triton.jit
def _gemv_row_kernel(x_ptr, w_ptr, scales_ptr, zeros_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr, N, K,
                     tiles_per_split, num_splits, stride_wn, stride_sn, stride_split, INT4: tl.constexpr,
                     GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr = 128,
                     HALF2: tl.constexpr = False, ASM: tl.constexpr = False):
    """One row of x: program (n, s) sums output channels of block n over input slice s (K is a
    multiple of BLOCK_K). Levels are fp32 numbers 2**BITS + level (`float_levels`), the offset folded
    into the sum as in `quant_tiles.py`; with HALF2 (int4, 16-bit inputs) a word's products are taken
    in packed arithmetic (`quant_half2.py`, its PTX where ASM)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    start = split * tiles_per_split * BLOCK_K
    end = tl.minimum(K, start + tiles_per_split * BLOCK_K)
    if INT4:
        # w_ptr holds int32 words, [N, K // 8]: word j of a row holds inputs 8j .. 8j + 7 in its
        # nibbles, low bits first (the packed bytes, read four at a time). Each thread keeps a sum
        # per row and word of its tile, and the rows are reduced across threads once, at the end: a
        # weight costs a shift, a bitwise operation and a multiply-add, and its products never
        # leave their thread inside the loop. Each sub-tile's scale and zero point are applied to
        # each of its words' sums of 8 products.
        # Each tile's loads are issued when its arithmetic needs them. Issuing them a tile ahead, in
        # a second tile's registers, was 6-10% slower for int4 and up to 21% for int8 on an H200
        # (three runs of scripts/quant_gemv_sweep.py, BENCHMARKS.md): the other programs of the SM
        # keep its memory busy while one waits.
        SUBTILES: tl.constexpr = BLOCK_K // SUB_K
        WORDS: tl.constexpr = SUB_K // 8
        rows = offs_n.to(tl.int64)[:, None] * stride_wn
        group_rows = offs_n[:, None] * stride_sn
        words = (tl.arange(0, SUBTILES) * WORDS)[:, None] + tl.arange(0, WORDS)[None, :]
        acc2 = tl.zeros([BLOCK_N, SUBTILES, WORDS], tl.float32)
        for k0 in range(start, end, BLOCK_K):
            w, x, group = _int4_row_tile(w_ptr, x_ptr, scales_ptr, zeros_ptr, rows, group_rows, words, mask_n, k0,
                                         GROUP_SIZE, BLOCK_K, SUB_K, HALF2)
            if HALF2:  # the four input pairs serve every row of the thread's share of the tile
                acc2 = word_dots_half2(w, x[0][None], x[1][None], x[2][None], x[3][None], group[:, :, None], acc2,
                                       x_ptr.dtype.element_ty == tl.bfloat16, ASM)
            else:
                planes = nibble_inputs(x, SUBTILES * WORDS)
                sums = tl.zeros([BLOCK_N, SUBTILES, WORDS], tl.float32)
                for i in tl.static_range(8):
                    sums += word_level(w, i) * tl.reshape(planes[i], [SUBTILES, WORDS])[None]
                x_sums = tl.sum(tl.reshape(x, [SUBTILES, WORDS, 8]), 2)
                scale, zero = group
                acc2 += (sums - (zero + 16)[:, :, None] * x_sums[None]) * scale[:, :, None]
        acc = tl.sum(tl.sum(acc2, 2), 1)[None, :] * (1 / LEVEL_UNIT if HALF2 else 1.0)
    else:
        # int8: one scale per row, applied when the rows are stored, so products are summed
        # elementwise over the whole slice and reduced across threads once, at the end. A level q
        # is stored shifted, as q + 128, to be non-negative for float_levels: 384 + q in all.
        rows = offs_n.to(tl.int64)[:, None] * stride_wn
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        x_sums = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(start, end, BLOCK_K):
            q, x = _int8_row_tile(w_ptr, x_ptr, rows, mask_n, k0, end, BLOCK_K)
            x = x.to(tl.float32)
            acc2 += float_levels(q.to(tl.int32) + 128, 8) * x[None, :]
            x_sums += x
        acc = (tl.sum(acc2, 1) - tl.sum(x_sums, 0) * 384)[None, :]
    finish_rows(acc, scales_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr, tl.zeros([1], tl.int32), offs_n,
                tl.full([1], 1, tl.int1), mask_n, 0, split, num_splits, stride_split, INT4, HAS_BIAS, SPLIT)
