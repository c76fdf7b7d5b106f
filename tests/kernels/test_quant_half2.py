"""The packed step of the one-row int4 kernel (minillm.kernels.quant_half2) without a GPU: its two
PTX programs (fp16 and bf16 inputs) run by a small evaluator of the instructions they use, as the
PTX manual defines them, against the sum they stand for, and the fp16 one bit for bit against the
steps the interpreter runs. The kernel tests (test_quant_kernels.py) check the interpreter's steps
inside the kernel; this checks that the PTX a GPU runs computes the same. Lanes are evaluated
independently, low half with low half, as packed instructions work."""

from __future__ import annotations

import math
import re
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from minillm.kernels.quant_half2 import (  # noqa: E402
    _BF16_PTX,
    _FP16_PTX,
    LEVEL_UNIT,
    input_pairs,
    packs,
    runs_ptx,
    word_dots_half2,
)


def _fp16(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def _to_fp16(value: float) -> int:
    return int(np.array([value], dtype=np.float16).view(np.uint16)[0])  # numpy rounds float64 to nearest even


def _bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def _to_bf16(value: float) -> int:
    """Round to nearest even at bf16's 8 significant bits, from the exact value."""
    if value == 0:
        return 0x8000 if math.copysign(1, value) < 0 else 0
    mantissa, exponent = math.frexp(value)
    rounded = math.ldexp(round(mantissa * 256), exponent - 8)
    return struct.unpack("<I", struct.pack("<f", rounded))[0] >> 16


FORMATS = {"f16x2": (_fp16, _to_fp16), "bf16x2": (_bf16, _to_bf16)}


def _pack(low: int, high: int) -> int:
    return low | high << 16


def _lanes(kind: str, op, *operands: int) -> int:
    """A packed instruction: each lane computed exactly in float64, then rounded once."""
    read, write = FORMATS[kind]
    lanes = zip(*((read(x & 0xFFFF), read(x >> 16)) for x in operands))
    return _pack(*(write(op(*lane)) for lane in lanes))


def _to_odd(exact: Fraction) -> float:
    """The float64 nearest `exact` toward zero, its last bit set where that is inexact: rounding it
    to fp32, 29 bits shorter, then rounds `exact` itself (round to odd)."""
    nearest = float(exact)
    if Fraction(nearest) == exact:
        return nearest
    toward_zero = nearest if abs(Fraction(nearest)) < abs(exact) else math.nextafter(nearest, 0.0)
    return struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", toward_zero))[0] | 1))[0]


def run_ptx(ptx: str, inputs: list[int | float]) -> float:
    """The value of $0 after `ptx`, with $1, $2, ... holding `inputs` (32-bit registers: bits, or
    the number an fp32 register holds)."""
    regs: dict[str, object] = {f"${i + 1}": v for i, v in enumerate(inputs)}
    floats = set()  # registers declared .f32: a .b32 moved into one is read as fp32 bits

    def value(operand: str):
        return int(operand, 16) if operand.startswith("0x") else regs[operand]

    for line in ptx.strip().strip("{}").split(";"):
        line = line.strip()
        if line.startswith(".reg .f32"):
            floats.update(name.strip() for name in line.removeprefix(".reg .f32").split(","))
        if not line or line.startswith(".reg"):
            continue
        opcode, rest = line.split(None, 1)
        if opcode == "mov.b32" and rest.startswith("{"):  # unpack a register into its two fp16 halves
            low, high, source = re.match(r"\{(\w+), (\w+)\}, (\$?\w+)", rest).groups()
            regs[low], regs[high] = _fp16(value(source) & 0xFFFF), _fp16(value(source) >> 16)
            continue
        dest, *args = [a.strip() for a in rest.split(",")]
        kind = opcode.split(".")[-1]
        if opcode == "mov.b32":
            bits = value(args[0])
            result = struct.unpack("<f", struct.pack("<I", bits))[0] if dest in floats else bits
        elif opcode == "lop3.b32":
            a, b, c, table = map(value, args)
            result = sum(((table >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i
                         for i in range(32))
        elif opcode == "shr.b32":
            result = value(args[0]) >> int(args[1])
        elif opcode == "shl.b32":
            result = value(args[0]) << int(args[1]) & 0xFFFFFFFF
        elif opcode == "and.b32":
            result = value(args[0]) & value(args[1])
        elif opcode == "mul.rn.f16x2":
            result = _lanes(kind, lambda a, b: a * b, *map(value, args))
        elif opcode in ("fma.rn.f16x2", "fma.rn.bf16x2"):
            result = _lanes(kind, lambda a, b, c: a * b + c, *map(value, args))
        elif opcode == "cvt.f32.f16":
            result = float(value(args[0]))
        elif opcode == "add.rn.f32":
            result = float(np.float32(value(args[0]) + value(args[1])))
        elif opcode == "fma.rn.f32":  # rounded once, through float64 rounded to odd
            result = float(np.float32(_to_odd(Fraction(value(args[0])) * Fraction(value(args[1]))
                                              + Fraction(value(args[2])))))
        else:
            raise AssertionError(f"the evaluator does not know {opcode}")
        regs[dest] = result
    return float(regs["$0"])


@triton.jit
def _interpreter_steps(words_ptr, x_ptr, scale_zero_ptr, acc_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = input_pairs(x_ptr, 0, offs)
    tl.store(out_ptr + offs, word_dots_half2(tl.load(words_ptr + offs), x[0], x[1], x[2], x[3],
                                             tl.load(scale_zero_ptr + offs), tl.load(acc_ptr + offs), False, False))


@pytest.fixture(scope="module")
def cases() -> dict[str, np.ndarray]:
    """Words of every bit pattern (the sign bit too); signed inputs of several magnitudes, up to
    thousands, where a lane's fp16 sum of 4 products would overflow if the levels were not scaled by
    1/16 (as fp32, exact in fp16 and bf16 alike: rounded to fp16, then to bf16's 8 bits); every zero
    point; scales of several sizes (as exact); and signed sums so far."""
    rng = np.random.default_rng(0)
    words = rng.integers(-2 ** 31, 2 ** 31, 64, dtype=np.int64).astype(np.int32)
    words[:4] = [0, -1, 0x76543210, -0x789ABCDF]
    x = (rng.standard_normal((64, 8)) * rng.choice([0.01, 1.0, 30.0, 4000.0], (64, 1))).astype(np.float16)
    scale = (rng.uniform(0.5, 1, 64) * 2.0 ** rng.integers(-8, 3, 64)).astype(np.float16)
    return {"words": words, "x": torch.from_numpy(x).bfloat16().float().numpy(), "zero": np.arange(64) % 16,
            "scale": torch.from_numpy(scale).bfloat16().float().numpy(),
            "acc": (rng.standard_normal(64) * rng.choice([0.0, 1.0, 1000.0], 64)).astype(np.float32)}


def _inputs(case: dict, j: int, to_bits) -> list[int]:
    """The PTX's operands for case j: the word, the inputs of nibbles (i, i + 4) packed as
    `input_pairs` makes them, the scale and zero point, and the sum so far (an fp32 register, which
    the evaluator holds as its number)."""
    x = case["x"][j]
    return ([int(case["words"][j]) & 0xFFFFFFFF] + [_pack(to_bits(float(x[i])), to_bits(float(x[i + 4])))
                                                     for i in range(4)]
            + [_pack(to_bits(float(case["scale"][j])), to_bits(float(case["zero"][j])))]
            + [float(case["acc"][j])])


def test_the_fp16_ptx_computes_what_the_interpreter_runs_bit_for_bit(cases):
    """The random cases, the last three replaced by cases where rounding twice where the GPU rounds
    once gives another sum: a multiply-add in fp32 before fp16 (a small and a large input in one
    lane: nibbles 0 and 1, levels 1 and 9), and the scale's product before the sum so far (lanes
    summing to more bits than fp32's product with the scale keeps)."""
    x = np.zeros((3, 8), dtype=np.float32)
    x[:2, 0], x[:2, 1] = [0.01564, -0.01564], [28.73, -28.73]
    x[2, 0], x[2, 4] = 612.5, -7.66796875
    cases = {"words": np.append(cases["words"][:-3], [0x91, 0x91, 0x10001]).astype(np.int32),
             "x": np.concatenate([cases["x"][:-3], x.astype(np.float16).astype(np.float32)]),
             **{key: np.append(cases[key][:-3], value).astype(cases[key].dtype)
                for key, value in (("zero", [0, 0, 0]), ("scale", [1.0, 0.75, 3.603515625]),
                                   ("acc", [0.0, 3.0, -125.16253662109375]))}}
    n = len(cases["words"])
    scale_zero = torch.from_numpy(np.stack([cases["scale"], cases["zero"]], 1)).half().view(torch.int32).reshape(-1)
    out = torch.empty(n)
    _interpreter_steps[(1,)](torch.from_numpy(cases["words"]), torch.from_numpy(cases["x"].reshape(-1)).half(),
                             scale_zero, torch.from_numpy(cases["acc"]), out, N=n)
    for j in range(n):
        assert run_ptx(_FP16_PTX.value, _inputs(cases, j, _to_fp16)) == out[j].item(), j


@pytest.mark.parametrize("dtype", ["f16x2", "bf16x2"])
def test_the_ptx_sums_each_level_less_the_zero_point_times_its_input_over_a_word(cases, dtype):
    ptx, unit_roundoff = {"f16x2": (_FP16_PTX, 2.0 ** -11), "bf16x2": (_BF16_PTX, 2.0 ** -8)}[dtype]
    for j, word in enumerate(cases["words"]):
        levels = [(int(word) & 0xFFFFFFFF) >> (4 * i) & 0xF for i in range(8)]
        x, scale, acc = cases["x"][j], cases["scale"][j], cases["acc"][j]
        exact = acc + scale * sum((level - cases["zero"][j]) * LEVEL_UNIT.value * float(x[i])
                                  for i, level in enumerate(levels))
        # two lanes of 4 roundings each, each at most a unit roundoff of a partial sum of at most
        # 4 x 15/16 |x|, then the fp32 sum's
        bound = scale * 8 * unit_roundoff * 4 * np.abs(x).max() + 2.0 ** -23 * (abs(exact) + abs(acc))
        assert abs(run_ptx(ptx.value, _inputs(cases, j, FORMATS[dtype][1])) - exact) <= bound, (j, levels)


def test_each_lane_meets_its_own_inputs():
    """One level at a time: the word with only nibble i away from the zero point, against inputs
    that are powers of two of different sizes, picks exactly input i (a swapped pair or lane would
    pick another), and the scale and the zero point are the halves they should be."""
    x = np.array([2.0 ** i for i in range(8)])
    for ptx, to_bits in ((_FP16_PTX, _to_fp16), (_BF16_PTX, _to_bf16)):
        for i in range(8):
            word = 0x55555555 & ~(0xF << 4 * i) | (0x7 << 4 * i)  # every level 5, nibble i at 7
            case = {"words": [word], "x": [x], "scale": [0.5], "zero": [5], "acc": np.float32([1.0])}
            assert run_ptx(ptx.value, _inputs(case, 0, to_bits)) == 1 + 0.5 * 2 * x[i] / 16, (ptx, i)


def test_bf16_takes_the_packed_step_only_where_its_ptx_runs(monkeypatch):
    from minillm.kernels.targets import TARGETS

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert packs(torch.float16, None) and packs(torch.float16, TARGETS[75])  # the interpreter runs fp16's steps
    assert packs(torch.bfloat16, TARGETS[80]) and packs(torch.bfloat16, TARGETS[90])
    assert not packs(torch.bfloat16, None) and not packs(torch.bfloat16, TARGETS[75])  # no bf16x2 before sm_80
    assert not packs(torch.float32, TARGETS[90])
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter, even for a GPU's tensors
    assert not packs(torch.bfloat16, TARGETS[90]) and not runs_ptx(TARGETS[90])
