"""The steps every quantized matmul kernel here repeats, as Triton device functions: turn stored
levels into numbers, fold a tile's products into the sum with its scale and zero point, and store
finished rows (the last of a split-K launch's programs adds up the slices).

Why levels carry an offset. OR-ing a level n (0..15 for int4; q + 128, 0..255, for int8) into the
mantissa of a power of two P whose mantissa step is 1 gives the number P + n exactly, in one bitwise
operation; an int-to-float conversion runs at a quarter of the rate of other arithmetic. Rather than
subtract P from every weight, the sums are taken over P + n and corrected once per group of inputs
that shares a scale s and zero point z:

    s * Σ_k (q_k - z) x_k  =  s * (Σ_k (P + q_k) x_k - (P + z) * Σ_k x_k)

so a weight costs one bitwise operation and one multiply-add, and the scale, the zero point and P a
few operations per group and output. The correction cancels two sums about P / |q - z| times the
result, so it needs exact products and fp32 sums, and a small P where the inputs are fp32:
- tensor cores (2 to 16 rows, prefill): fp16 levels (P = 1024, the bit pattern 0x6400) times fp16
  inputs are exact products summed in fp32, so fp16 inputs fold P. bf16 cannot hold 1024 + n, and
  fp32 inputs would lose P * 2^-24 of each input, so for them P is subtracted first (exactly, in fp16).
  Where int4 is read as int32 words (the decode path, groups of 128 and more), bf16 levels carry
  P = 128 (0x4300, whose mantissa step is 1 too), and fp32 levels the one-row kernel's P = 16.
- the plain ALUs (one row): fp16 products would keep only the few bits of the level beside P, and
  fp16 sums overflow on large activations, so products and sums are fp32, with P = 16 (int4) or 256
  (int8) at the top of the mantissa; except for int4 with 16-bit inputs, whose levels are made
  (level - zero) / 16 first, exactly, and then multiplied and summed 4 at a time in packed fp16 or
  bf16 (`quant_half2.py`): they carry no offset, and no sum of inputs is needed.

Why int4 is read as words on the decode path. Unpacking the bytes one at a time, with the two
nibbles of each interleaved back into input order, costs more instructions per weight byte than an
H100 can issue while its memory delivers one (`kernels/sass.py`). An int32 word holds 8 levels, of
inputs 8j .. 8j + 7; nibble i of every word of a tile is a shift and a mask away, and meets the
inputs 8j + i, which the inputs' tile gives by splitting its columns (`nibble_inputs`) rather than
the weights by moving theirs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_FP16_MAGIC_BITS = tl.constexpr(0x6400)  # fp16 1024.0: mantissa step 1 from 1024 to 2048


def dot_level_offset(int4: bool, dtype: torch.dtype) -> int:
    """The offset each level carries in the tensor-core paths, folded into the sum: P = 1024, plus
    int8's shift of 128; 0 where the levels are made exact (bf16 and fp32 inputs)."""
    return (1024 + (0 if int4 else 128)) if dtype == torch.float16 else 0


@triton.jit
def load_levels(w_ptr, offs_n, mask_n, k0, K, stride_wn, BLOCK_K: tl.constexpr, INT4: tl.constexpr,
                DTYPE: tl.constexpr, OFFSET: tl.constexpr):
    """Levels of output channels offs_n, inputs k0 .. k0 + BLOCK_K, as a [BLOCK_N, BLOCK_K] tile in
    DTYPE, each plus OFFSET (`dot_level_offset`). int4: the tile lies in one group (BLOCK_K divides
    GROUP_SIZE); int8: the raw signed levels, whose row scale is applied to the finished sum."""
    rows = offs_n.to(tl.int64)[:, None] * stride_wn
    if INT4:
        # Byte j holds input 2j (low nibble) and 2j + 1 (high nibble). Interleaving the two nibble
        # tiles restores input order, so x stays one contiguous load and each tile one tl.dot; the
        # alternative, splitting x into even and odd columns for two dots, would turn x's loads into
        # stride-2 gathers. tl.join places its new axis within a thread, so no data crosses threads.
        packed = tl.load(w_ptr + rows + k0 // 2 + tl.arange(0, BLOCK_K // 2)[None, :], mask=mask_n[:, None],
                         other=0).to(tl.int16)
        levels = tl.interleave(packed & 0xF, packed >> 4)
        magic = 1024.0
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        levels = tl.load(w_ptr + rows + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :],
                         other=0).to(tl.int16) + 128
        magic = 1152.0
    w = (levels | _FP16_MAGIC_BITS).to(tl.float16, bitcast=True)
    if OFFSET == 0:
        w = (w - magic).to(DTYPE)  # exact: a small integer
    return w


@triton.jit
def dot_tile(acc, x, w_ptr, scales_ptr, zeros_ptr, offs_n, mask_n, k0, K, stride_wn, stride_sn,
             BLOCK_K: tl.constexpr, GROUP_SIZE: tl.constexpr, INT4: tl.constexpr, OFFSET: tl.constexpr,
             PRECISION: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] (fp32) plus x [BLOCK_M, BLOCK_K] @ the weight tile at k0, transposed:
    int4 dequantized, int8 in raw levels. Scale, zero point and offset come once per tile (it lies
    in one group), from x's row sums."""
    w = load_levels(w_ptr, offs_n, mask_n, k0, K, stride_wn, BLOCK_K, INT4, x.dtype, OFFSET)
    if INT4 or OFFSET != 0:
        products = tl.dot(x, tl.trans(w), input_precision=PRECISION)
        x_sums = tl.sum(x.to(tl.float32), 1)[:, None]
        if INT4:
            group = k0 // GROUP_SIZE
            scale = tl.load(scales_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
            zero = tl.load(zeros_ptr + offs_n * stride_sn + group, mask=mask_n, other=0.0).to(tl.float32)
            acc += (products - x_sums * (zero + OFFSET)[None, :]) * scale[None, :]
        else:
            acc += products - x_sums * OFFSET
    else:
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    return acc


@triton.jit
def float_levels(levels, BITS: tl.constexpr):
    """levels (int32 in [0, 2**BITS)) -> the fp32 numbers 2**BITS + level, by OR-ing each level into
    the top of the mantissa of 2**BITS, where the mantissa's step is 1."""
    return ((levels << (23 - BITS)) | ((127 + BITS) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def word_level(words, i: tl.constexpr):
    """Nibble i of each int32 word (bits 4i .. 4i + 3) -> the fp32 number 16 + level, as
    `float_levels` makes it: moved to the top of the mantissa and OR-ed into 16's bits (0x41800000),
    a shift and one bitwise operation (the mask and the OR in one)."""
    if 4 * i <= 19:
        bits = (words << (19 - 4 * i)) & 0x780000
    else:  # an arithmetic shift: the copies of the sign bit land above the mask
        bits = (words >> (4 * i - 19)) & 0x780000
    return (bits | 0x41800000).to(tl.float32, bitcast=True)


def word_level_offset(dtype: torch.dtype) -> int:
    """The offset P each level carries where int4 weights are read as int32 words (`word_level`,
    `word_dot_level`): fp16 1024 and bf16 128 (a mantissa step of 1 there), fp32 16."""
    return {torch.float16: 1024, torch.bfloat16: 128}.get(dtype, 16)


@triton.jit
def word_dot_level(words, i: tl.constexpr, DTYPE: tl.constexpr):
    """Nibble i of each int32 word as a tl.dot operand of DTYPE, P + level (`word_level_offset`):
    for 16-bit inputs the level OR-ed into P's bits and the low half of the word reinterpreted;
    for fp32 inputs `word_level`'s fp32 number."""
    if DTYPE == tl.float16:
        return (((words >> (4 * i)) & 0xF) | _FP16_MAGIC_BITS).to(tl.int16).to(tl.float16, bitcast=True)
    elif DTYPE == tl.bfloat16:
        return (((words >> (4 * i)) & 0xF) | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)  # bf16 128.0
    else:
        return word_level(words, i)


@triton.jit
def nibble_inputs(x, WORDS: tl.constexpr):
    """x [8 * WORDS] or [R, 8 * WORDS] -> the inputs that meet each nibble of a word: eight [WORDS] or
    [R, WORDS] tensors, the i-th holding input 8j + i for each word j. Input 8j + 4a + 2b + c: split
    off c, then b, then a."""
    if len(x.shape) == 1:
        c0, c1 = tl.split(tl.reshape(x, [WORDS, 2, 2, 2]))
    else:
        c0, c1 = tl.split(tl.reshape(x, [x.shape[0], WORDS, 2, 2, 2]))
    b00, b01 = tl.split(c0)
    b10, b11 = tl.split(c1)
    x0, x4 = tl.split(b00)
    x2, x6 = tl.split(b01)
    x1, x5 = tl.split(b10)
    x3, x7 = tl.split(b11)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def store_rows(acc, scales_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_m, mask_n, stride_om,
               INT4: tl.constexpr, HAS_BIAS: tl.constexpr):
    if not INT4:  # int8: the row's scale was left out of the sum (see load_levels)
        acc = acc * tl.load(scales_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def finish_rows(acc, scales_ptr, bias_ptr, out_ptr, partial_ptr, counter_ptr, offs_m, offs_n, mask_m, mask_n,
                stride_om, split, num_splits, stride_split, INT4: tl.constexpr, HAS_BIAS: tl.constexpr,
                SPLIT: tl.constexpr):
    """Store a program's sums acc [BLOCK_M, BLOCK_N] of rows offs_m, channels offs_n. With SPLIT
    (several slices of the inputs), each slice writes its fp32 sums to partial_ptr (laid out as the
    output, one plane of stride_split per slice) and takes a ticket from its output block's counter;
    the program with the last ticket adds the slices in their fixed order, so the result has the same
    bits whichever slice finishes last, stores the rows and sets the counter back to 0 for the next
    launch."""
    if SPLIT:
        offs = offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
        tl.store(partial_ptr + split.to(tl.int64) * stride_split + offs, acc, mask=mask)
        tl.debug_barrier()  # every thread's sums are stored before the ticket is taken
        counter = counter_ptr + tl.program_id(0) + tl.program_id(2) * tl.num_programs(0)
        if tl.atomic_add(counter, 1, sem="acq_rel") == num_splits - 1:
            acc = tl.zeros_like(acc)
            for s in range(num_splits):
                acc += tl.load(partial_ptr + s * stride_split + offs, mask=mask, other=0.0, cache_modifier=".cg")
            store_rows(acc, scales_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, INT4,
                       HAS_BIAS)
            tl.atomic_xchg(counter, 0)
    else:
        store_rows(acc, scales_ptr, bias_ptr, out_ptr, offs_m, offs_n, mask_m, mask_n, stride_om, INT4, HAS_BIAS)
