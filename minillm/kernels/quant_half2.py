"""int4 words times fp16 inputs in packed fp16 (half2) arithmetic: the one-row int4 kernel's inner
step where its inputs are fp16.

A 32-bit register holds two fp16 numbers, and one half2 instruction works on both. One bitwise
operation (PTX `lop3`) turns two nibbles of a word into two numbers: masking nibbles 0 and 4 (bits
0-3 and 16-19) and OR-ing 0x6400 (fp16 1024) into each half gives 1024 + level, exactly, as
`quant_tiles.py` explains; nibbles 1 and 5 land 4 bits higher, as 1024 + 16 level. A word's 8
levels, as (0, 4), (1, 5), (2, 6), (3, 7), cost a shift and four such operations, four half2
multiply-adds make them (level - 8) / 8 (exact: multiples of 1/8 below 1), and four more take their
products with the inputs that meet them, packed in the same pairs (`half2_pairs`): 13 instructions
a word, 3.25 a weight byte, where the fp32 loop issues about 9.6 (`kernels/sass.py`).

Why (level - 8) / 8 and not 1024 + level, as the fp32 loop keeps: an fp16 product keeps 11 bits,
which (1024 + level) x would spend on the 1024. Centred and scaled levels also keep the sums small:
a product is at most |x|, and a lane sums 4 of them before the sum moves to fp32, so it overflows
only if an fp16 model's inputs exceed 16,000 on all four. The 1/8 comes free, in the constants of
the multiply-adds that centre the levels, and goes back in the scale. The price is precision: each
product and partial sum rounds to fp16 (2^-11), where the fp32 loop rounds to 2^-24, about the
rounding of the fp16 output itself. bf16 inputs keep the fp32 loop: a bf16 product keeps 8 bits.

Triton has no half2 arithmetic of its own (it compiles fp16 operations one number at a time), so on
a GPU the step is inline PTX. Triton's CPU interpreter cannot run PTX; there the same steps run in
Triton operations on the same packed bits (the masks, the magic number, the pairs), fp16 rounding
included, so that the tests check the pairing and the constants.
"""

from __future__ import annotations

import struct

import triton
import triton.language as tl

_MAGIC = tl.constexpr(0x64006400)  # fp16 1024.0 in both halves
_LOW_NIBBLES = tl.constexpr(0x000F000F)  # nibbles 0 and 4 of a word (bits 0-3, 16-19): 1024 + level
_HIGH_NIBBLES = tl.constexpr(0x00F000F0)  # nibbles 1 and 5 (bits 4-7, 20-23): 1024 + 16 level
# (level - 8) / 8 from 1024 + level and from 1024 + 16 level, in one multiply-add each
_EIGHTH, _MINUS_129 = 0x3000, 0xD808  # fp16 1/8 and -129: (1024 + level) / 8 - 129
_128TH, _MINUS_9 = 0x2000, 0xC880  # fp16 1/128 and -9: (1024 + 16 level) / 128 - 9


def fp16_value(bits: int) -> float:
    return struct.unpack("<e", bits.to_bytes(2, "little"))[0]


# The interpreter's steps take the PTX's constants, read back as numbers.
_LOW_MUL, _LOW_ADD = tl.constexpr(fp16_value(_EIGHTH)), tl.constexpr(fp16_value(_MINUS_129))
_HIGH_MUL, _HIGH_ADD = tl.constexpr(fp16_value(_128TH)), tl.constexpr(fp16_value(_MINUS_9))


def _half2(bits: int) -> str:
    return f"0x{bits:04X}{bits:04X}"


def _hex(word: tl.constexpr) -> str:
    return f"0x{word.value:08X}"


# lop3's truth table 0xEA is (a & b) | c. Without a rounding mode, ptxas may fuse a multiply and an
# add into one multiply-add; .rn keeps every step as written (and as the interpreter runs it).
_WORD_DOT_PTX = tl.constexpr(f"""{{
.reg .b32 t0, t1, t2, t3, s, a, c0, c1, c2, c3;
.reg .f16 h0, h1;
.reg .f32 f0, f1;
mov.b32 c0, {_half2(_EIGHTH)};
mov.b32 c1, {_half2(_MINUS_129)};
mov.b32 c2, {_half2(_128TH)};
mov.b32 c3, {_half2(_MINUS_9)};
lop3.b32 t0, $1, {_hex(_LOW_NIBBLES)}, {_hex(_MAGIC)}, 0xEA;
lop3.b32 t1, $1, {_hex(_HIGH_NIBBLES)}, {_hex(_MAGIC)}, 0xEA;
shr.b32 s, $1, 8;
lop3.b32 t2, s, {_hex(_LOW_NIBBLES)}, {_hex(_MAGIC)}, 0xEA;
lop3.b32 t3, s, {_hex(_HIGH_NIBBLES)}, {_hex(_MAGIC)}, 0xEA;
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
add.rn.f32 $0, f0, f1;
}}""")

# Each level here is (level + LEVEL_OFFSET) * LEVEL_UNIT: the offset folds into the sum as in
# `quant_tiles.py`, and the unit into the scale.
LEVEL_OFFSET = tl.constexpr(-8)
LEVEL_UNIT = tl.constexpr(0.125)


@triton.jit
def half2_pairs(low, high):
    """Two fp16 tensors -> int32 words holding `low` in their low half and `high` in their high half,
    as a half2 register holds two numbers."""
    low_bits = low.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return low_bits | (high.to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _halves(pairs):
    """The inverse of `half2_pairs`, in fp32."""
    low = (pairs & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    high = ((pairs >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    return low.to(tl.float32), high.to(tl.float32)


@triton.jit
def _multiply_add(levels, pairs, sums):
    """Both lanes of fp16 fma(levels, inputs, sums), one rounding each, on fp32 numbers that fp16
    holds (the product of two fp16 numbers is exact in fp32)."""
    l0, l1 = _halves(levels)
    x0, x1 = _halves(pairs)
    s0, s1 = sums
    return (l0 * x0 + s0).to(tl.float16).to(tl.float32), (l1 * x1 + s1).to(tl.float16).to(tl.float32)


@triton.jit
def _centred_levels(words, MASK: tl.constexpr):
    """The interpreter's lop3 and level fix-up: two nibbles per word as (level - 8) / 8 in both
    halves of an int32 (fp16 bits), through 1024 + level or 1024 + 16 level as on the GPU."""
    magic = _halves((words & MASK) | _MAGIC)
    if MASK == _LOW_NIBBLES:
        low, high = magic[0] * _LOW_MUL + _LOW_ADD, magic[1] * _LOW_MUL + _LOW_ADD
    else:
        low, high = magic[0] * _HIGH_MUL + _HIGH_ADD, magic[1] * _HIGH_MUL + _HIGH_ADD
    return half2_pairs(low.to(tl.float16), high.to(tl.float16))


@triton.jit
def word_dots_half2(words, x0, x1, x2, x3, ASM: tl.constexpr):
    """For each int32 word of 8 levels, sum_i (level_i - 8) / 8 x_i in fp32, where x0 .. x3 are
    `half2_pairs` of the inputs that meet nibbles (0, 4), (1, 5), (2, 6) and (3, 7): each lane sums
    its 4 products in fp16, and the two lanes are added in fp32. ASM: the PTX (a GPU); otherwise the
    same steps in Triton operations (the interpreter)."""
    if ASM:
        return tl.inline_asm_elementwise(_WORD_DOT_PTX, "=r,r,r,r,r,r", [words, x0, x1, x2, x3], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        shifted = words >> 8
        l0, l1 = _halves(_centred_levels(words, _LOW_NIBBLES))
        p0, p1 = _halves(x0)
        sums = (l0 * p0).to(tl.float16).to(tl.float32), (l1 * p1).to(tl.float16).to(tl.float32)
        sums = _multiply_add(_centred_levels(words, _HIGH_NIBBLES), x1, sums)
        sums = _multiply_add(_centred_levels(shifted, _LOW_NIBBLES), x2, sums)
        sums = _multiply_add(_centred_levels(shifted, _HIGH_NIBBLES), x3, sums)
        return sums[0] + sums[1]
