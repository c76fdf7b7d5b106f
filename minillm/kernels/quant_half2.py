"""int4 words times 16-bit inputs in packed arithmetic (half2: two fp16 or two bf16 numbers in one
32-bit register, one instruction for both): the one-row int4 kernel's inner step.

One bitwise operation (PTX `lop3`) turns two nibbles of a word into two numbers: masking nibbles 0
and 4 (bits 0-3 and 16-19) and OR-ing a power of two P whose mantissa step is 1 into each half
gives P + level, exactly, as `quant_tiles.py` explains (fp16 1024, bf16 128). A word's 8 levels
come as the pairs (0, 4), (1, 5), (2, 6), (3, 7): four such operations and a shift (fp16 takes
nibbles 1 and 5 four bits higher, as 1024 + 16 level, and needs one shift; bf16's 7 mantissa bits
cannot hold them there, and it takes three). Four packed multiply-adds make the pairs
(level - zero) / 16, exactly: each scales P + level (or P + 16 level) and adds a constant that
takes away both P's share and the group's zero point, -(64 + zero / 16) or -(4 + zero / 16) for
fp16, -(8 + zero / 16) for bf16, made once per row from the zero point (an integer, 0 to 15) by a
packed multiply-add of its own. Four more take the products with the inputs that meet them, which
the kernel loads as int32 pairs of the same shape (`input_pairs`); two instructions move each
lane's sum to fp32, one adds them, and one multiply-add applies the group's scale and adds the
result to the thread's sum: 17 instructions a word for fp16 (19 for bf16), and nothing per group or
per input outside the step. `kernels/sass.py` counts whole loops.

Why (level - zero) / 16 and not P + level, as the fp32 loop keeps: a 16-bit product keeps 11 (fp16)
or 8 (bf16) bits, which (P + level) x would spend on P, and with the zero point subtracted before
the products no sum of inputs has to be taken apart from them and subtracted after. The 1/16 keeps
the fp16 sums small: a product is at most 15/16 |x|, and a lane adds 4 of them before its sum moves
to fp32, so it cannot overflow while every input is below 17,467 in size, and can only once four
inputs of one lane add up past about 69,836, the rounding of their partial sums included (bf16 has
fp32's range). It comes free, in the constants of the multiply-adds that centre the levels, and
the kernel multiplies its sums by 16 once, at the end. The price is precision: each product and
partial sum rounds to the inputs' dtype (2^-11 for fp16, 2^-8 for bf16) where the fp32 loop keeps
24 bits; that is about one more rounding of the result, which is itself rounded to the inputs'
dtype.

Triton has no packed arithmetic of its own (it compiles 16-bit operations one number at a time), so
on a GPU the step is inline PTX: fp16 from sm_53, bf16 (`fma.rn.bf16x2`) from sm_80, the first GPUs
with bf16 arithmetic (`packs`). Triton's CPU interpreter runs no PTX: there the fp16 steps run in
Triton operations on the same packed bits (the masks, the magic number, the pairs, fp16 rounding),
so that the kernel tests check the pairing and the constants, and bf16 keeps the fp32 loop.
tests/kernels/test_quant_half2.py runs both PTX programs through an evaluator of their instructions.
"""

from __future__ import annotations

import os
import struct

import torch
import triton
import triton.language as tl

from minillm.kernels.targets import GPUSpec

_LOW_NIBBLES = tl.constexpr(0x000F000F)  # nibbles 0 and 4 of a word (bits 0-3, 16-19)
_HIGH_NIBBLES = tl.constexpr(0x00F000F0)  # nibbles 1 and 5 (bits 4-7, 20-23)
_FP16_MAGIC = tl.constexpr(0x64006400)  # fp16 1024.0 in both halves
_BF16_MAGIC = 0x43004300  # bf16 128.0 in both halves
# (level - zero) / 16 in one multiply-add each: fp16 (1024 + level) / 16 - (64 + zero / 16) and
# (1024 + 16 level) / 256 - (4 + zero / 16); bf16 (128 + level) / 16 - (8 + zero / 16). The
# constants subtracted are themselves one multiply-add of the zero point: zero * -1/16 - 64 (- 4, - 8).
_SIXTEENTH, _256TH, _MINUS_SIXTEENTH, _MINUS_64, _MINUS_4 = 0x2C00, 0x1C00, 0xAC00, 0xD400, 0xC400  # fp16
_BF16_SIXTEENTH, _BF16_MINUS_SIXTEENTH, _BF16_MINUS_8, _BF16_MINUS_0 = 0x3D80, 0xBD80, 0xC100, 0x8000
LEVEL_UNIT = tl.constexpr(0.0625)  # the step's levels are (level - zero) * LEVEL_UNIT


def fp16_value(bits: int) -> float:
    return struct.unpack("<e", bits.to_bytes(2, "little"))[0]


# The interpreter's steps take the PTX's constants, read back as numbers.
_LOW_MUL, _LOW_CENTRE = tl.constexpr(fp16_value(_SIXTEENTH)), tl.constexpr(-fp16_value(_MINUS_64))
_HIGH_MUL, _HIGH_CENTRE = tl.constexpr(fp16_value(_256TH)), tl.constexpr(-fp16_value(_MINUS_4))


def _pair(bits: int) -> str:
    return f"0x{bits:04X}{bits:04X}"


def _hex(word) -> str:
    return f"0x{getattr(word, 'value', word):08X}"


# Operands: $1 the word, $2-$5 the input pairs, $6 the group's scale (low half) and zero point (high
# half), $7 the sum so far; $0 the sum after. lop3's truth table 0xEA is (a & b) | c: the zero point
# in both halves, and the masked nibbles OR the magic number. Without a rounding mode, ptxas may fuse
# a multiply and an add into one multiply-add; .rn keeps every step as written (and as the
# interpreter runs it). The centring constants and the scale's conversion depend on the row alone,
# the same for each of its words, and ptxas computes them once a row.
_FP16_PTX = tl.constexpr(f"""{{
.reg .b32 t0, t1, t2, t3, s, a, z, c0, c1, c2, c3, m;
.reg .f16 h0, h1;
.reg .f32 f0, f1;
shr.b32 s, $6, 16;
lop3.b32 z, $6, 0xFFFF0000, s, 0xEA;
mov.b32 m, {_pair(_MINUS_SIXTEENTH)};
mov.b32 c1, {_pair(_MINUS_64)};
mov.b32 c3, {_pair(_MINUS_4)};
fma.rn.f16x2 c1, z, m, c1;
fma.rn.f16x2 c3, z, m, c3;
mov.b32 c0, {_pair(_SIXTEENTH)};
mov.b32 c2, {_pair(_256TH)};
lop3.b32 t0, $1, {_hex(_LOW_NIBBLES)}, {_hex(_FP16_MAGIC)}, 0xEA;
lop3.b32 t1, $1, {_hex(_HIGH_NIBBLES)}, {_hex(_FP16_MAGIC)}, 0xEA;
shr.b32 s, $1, 8;
lop3.b32 t2, s, {_hex(_LOW_NIBBLES)}, {_hex(_FP16_MAGIC)}, 0xEA;
lop3.b32 t3, s, {_hex(_HIGH_NIBBLES)}, {_hex(_FP16_MAGIC)}, 0xEA;
fma.rn.f16x2 t0, t0, c0, c1;
fma.rn.f16x2 t1, t1, c2, c3;
fma.rn.f16x2 t2, t2, c0, c1;
fma.rn.f16x2 t3, t3, c2, c3;
mul.rn.f16x2 a, t0, $2;
fma.rn.f16x2 a, t1, $3, a;
fma.rn.f16x2 a, t2, $4, a;
fma.rn.f16x2 a, t3, $5, a;
mov.b32 {{h0, h1}}, a;
cvt.f32.f16 f0, h0;
cvt.f32.f16 f1, h1;
add.rn.f32 f0, f0, f1;
mov.b32 {{h0, h1}}, $6;
cvt.f32.f16 f1, h0;
fma.rn.f32 $0, f0, f1, $7;
}}""")

# bf16: a lane's bits moved to the top of an fp32 are that number (bf16 is fp32's top half);
# sm_80 has fma.rn.bf16x2 but no packed bf16 multiply, so the first product adds -0.
_BF16_PTX = tl.constexpr(f"""{{
.reg .b32 t0, t1, t2, t3, s, a, z, c0, c1, c2;
.reg .f32 f0, f1;
shr.b32 s, $6, 16;
lop3.b32 z, $6, 0xFFFF0000, s, 0xEA;
mov.b32 c0, {_pair(_BF16_MINUS_SIXTEENTH)};
mov.b32 c1, {_pair(_BF16_MINUS_8)};
fma.rn.bf16x2 c1, z, c0, c1;
mov.b32 c0, {_pair(_BF16_SIXTEENTH)};
mov.b32 c2, {_pair(_BF16_MINUS_0)};
lop3.b32 t0, $1, {_hex(_LOW_NIBBLES)}, {_hex(_BF16_MAGIC)}, 0xEA;
shr.b32 s, $1, 4;
lop3.b32 t1, s, {_hex(_LOW_NIBBLES)}, {_hex(_BF16_MAGIC)}, 0xEA;
shr.b32 s, $1, 8;
lop3.b32 t2, s, {_hex(_LOW_NIBBLES)}, {_hex(_BF16_MAGIC)}, 0xEA;
shr.b32 s, $1, 12;
lop3.b32 t3, s, {_hex(_LOW_NIBBLES)}, {_hex(_BF16_MAGIC)}, 0xEA;
fma.rn.bf16x2 t0, t0, c0, c1;
fma.rn.bf16x2 t1, t1, c0, c1;
fma.rn.bf16x2 t2, t2, c0, c1;
fma.rn.bf16x2 t3, t3, c0, c1;
fma.rn.bf16x2 a, t0, $2, c2;
fma.rn.bf16x2 a, t1, $3, a;
fma.rn.bf16x2 a, t2, $4, a;
fma.rn.bf16x2 a, t3, $5, a;
shl.b32 s, a, 16;
mov.b32 f0, s;
and.b32 s, a, 0xFFFF0000;
mov.b32 f1, s;
add.rn.f32 f0, f0, f1;
shl.b32 s, $6, 16;
mov.b32 f1, s;
fma.rn.f32 $0, f0, f1, $7;
}}""")


def runs_ptx(target: GPUSpec | None) -> bool:
    """Whether a launch for `target` (None: the interpreter) runs the PTX rather than its steps in
    Triton operations: on a GPU, unless Triton's interpreter runs even GPU tensors' kernels."""
    return target is not None and os.environ.get("TRITON_INTERPRET") != "1"


def packs(dtype: torch.dtype, target: GPUSpec | None) -> bool:
    """Whether int4 products with inputs of `dtype` take the packed step on `target`: fp16 always
    (its PTX, or its steps in the interpreter); bf16 where its PTX runs, from sm_80."""
    if dtype == torch.bfloat16:
        return runs_ptx(target) and target.capability >= 80
    return dtype == torch.float16


@triton.jit
def half2_pairs(low, high):
    """Two tensors of a 16-bit dtype -> int32 words holding `low` in their low half and `high` in
    their high half, as a packed register holds two numbers."""
    low_bits = low.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return low_bits | (high.to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def input_pairs(x_ptr, k0, offs_j):
    """The 16-bit inputs k0 + 8j .. k0 + 8j + 7 of words j = offs_j as the four int32 pairs that meet
    nibbles (0, 4), (1, 5), (2, 6), (3, 7), read as int32 (two inputs each) in offs_j's own layout,
    so that no thread waits for another's inputs. Each pair takes one byte permute on a GPU."""
    base = x_ptr.to(tl.pointer_type(tl.int32)) + k0 // 2 + 4 * offs_j
    x01, x23, x45, x67 = tl.load(base), tl.load(base + 1), tl.load(base + 2), tl.load(base + 3)
    high = -65536  # 0xFFFF0000 as an int32
    return ((x01 & 0xFFFF) | (x45 << 16), ((x01 >> 16) & 0xFFFF) | (x45 & high),
            (x23 & 0xFFFF) | (x67 << 16), ((x23 >> 16) & 0xFFFF) | (x67 & high))


@triton.jit
def _halves(pairs):
    """The inverse of `half2_pairs` for fp16, in fp32."""
    low = (pairs & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    high = ((pairs >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    return low.to(tl.float32), high.to(tl.float32)


@triton.jit
def _multiply_add(levels, pairs, sums):
    """Both lanes of fp16 fma(levels, inputs, sums), rounded once to fp16 as the GPU's is: taken in
    fp64, where the product and the sum are exact for these operands (a level has 4 significant
    bits, the inputs and sums fp16's 11)."""
    l0, l1 = _halves(levels)
    x0, x1 = _halves(pairs)
    s0, s1 = sums
    return ((l0.to(tl.float64) * x0 + s0).to(tl.float16).to(tl.float32),
            (l1.to(tl.float64) * x1 + s1).to(tl.float16).to(tl.float32))


@triton.jit
def _centred_levels(words, zero, MASK: tl.constexpr):
    """The interpreter's lop3 and level fix-up for fp16: two nibbles per word as (level - zero) / 16
    in both halves of an int32 (fp16 bits), through 1024 + level or 1024 + 16 level as on the GPU,
    and a centre rounded to fp16 as the PTX makes it."""
    magic = _halves((words & MASK) | _FP16_MAGIC)
    if MASK == _LOW_NIBBLES:
        mul, centre = _LOW_MUL, (zero * 0.0625 + _LOW_CENTRE).to(tl.float16).to(tl.float32)
    else:
        mul, centre = _HIGH_MUL, (zero * 0.0625 + _HIGH_CENTRE).to(tl.float16).to(tl.float32)
    return half2_pairs((magic[0] * mul - centre).to(tl.float16), (magic[1] * mul - centre).to(tl.float16))


@triton.jit
def word_dots_half2(words, x0, x1, x2, x3, scale_zero, acc, BF16: tl.constexpr, ASM: tl.constexpr):
    """acc + s * sum_i (level_i - z) / 16 x_i in fp32 for each int32 word of 8 levels, where x0 .. x3
    are the inputs (fp16, or bf16 where BF16) that meet nibbles (0, 4), (1, 5), (2, 6) and (3, 7) as
    `input_pairs` reads them, and scale_zero holds the group's scale s and zero point z, `half2_pairs`
    (s, z): each lane sums its 4 products in the inputs' dtype, and the two lanes are added in fp32.
    ASM: the PTX (`runs_ptx`); otherwise the same fp16 steps in Triton operations."""
    if ASM:
        return tl.inline_asm_elementwise(_BF16_PTX if BF16 else _FP16_PTX, "=r,r,r,r,r,r,r,r",
                                         [words, x0, x1, x2, x3, scale_zero, acc], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        tl.static_assert(not BF16, "bf16 takes the packed step where its PTX runs only (`packs`)")
        scale, zero = _halves(scale_zero)
        shifted = words >> 8
        l0, l1 = _halves(_centred_levels(words, zero, _LOW_NIBBLES))
        p0, p1 = _halves(x0)
        sums = (l0 * p0).to(tl.float16).to(tl.float32), (l1 * p1).to(tl.float16).to(tl.float32)
        sums = _multiply_add(_centred_levels(words, zero, _HIGH_NIBBLES), x1, sums)
        sums = _multiply_add(_centred_levels(shifted, zero, _LOW_NIBBLES), x2, sums)
        sums = _multiply_add(_centred_levels(shifted, zero, _HIGH_NIBBLES), x3, sums)
        # one rounding, as the GPU's fused multiply-add, but for a tie after an inexact fp64 sum
        # (the sum so far and the product 2^24 or more apart)
        return (acc.to(tl.float64) + scale.to(tl.float64) * (sums[0] + sums[1])).to(tl.float32)
