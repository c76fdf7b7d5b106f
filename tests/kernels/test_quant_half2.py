"""The packed fp16 step of the one-row int4 kernel (minillm.kernels.quant_half2) without a GPU: its
PTX run by a small evaluator of the dozen instructions it uses, as the PTX manual defines them,
against the steps the interpreter runs (bit for bit) and against the sum it stands for. The kernel
tests (test_quant_kernels.py) check the interpreter's steps inside the kernel; this checks that the
PTX a GPU runs computes the same."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from minillm.kernels.quant_half2 import _WORD_DOT_PTX, LEVEL_OFFSET, LEVEL_UNIT, half2_pairs, word_dots_half2  # noqa: E402


def _halves(bits: int) -> tuple[np.float16, np.float16]:
    return tuple(np.array([bits & 0xFFFF, bits >> 16], dtype=np.uint16).view(np.float16))


def _pack(low: float, high: float) -> int:
    lo, hi = np.array([low, high], dtype=np.float16).view(np.uint16)
    return int(lo) | int(hi) << 16


def _lanes(op, *operands: int) -> int:
    """A half2 instruction: each lane computed exactly in float64 and rounded once to fp16."""
    lanes = zip(*(_halves(x) for x in operands))
    return _pack(*(op(*map(np.float64, lane)) for lane in lanes))


def run_ptx(ptx: str, inputs: list[int]) -> float:
    """The value of $0 after `ptx`, with $1, $2, ... holding `inputs` (32-bit registers)."""
    regs: dict[str, object] = {f"${i + 1}": v for i, v in enumerate(inputs)}

    def value(operand: str):
        return int(operand, 16) if operand.startswith("0x") else regs[operand]

    for line in ptx.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        opcode, rest = line.split(None, 1)
        if opcode == "mov.b32" and rest.startswith("{"):  # unpack a register into its two halves
            low, high, source = re.match(r"\{(\w+), (\w+)\}, (\w+)", rest).groups()
            regs[low], regs[high] = _halves(value(source))
            continue
        dest, *args = [a.strip() for a in rest.split(",")]
        if opcode == "mov.b32":
            result = value(args[0])
        elif opcode == "lop3.b32":
            a, b, c, table = map(value, args)
            result = sum(((table >> ((a >> i & 1) << 2 | (b >> i & 1) << 1 | (c >> i & 1))) & 1) << i
                         for i in range(32))
        elif opcode == "shr.b32":
            result = value(args[0]) >> int(args[1])
        elif opcode == "add.rn.f16x2":
            result = _lanes(lambda a, b: a + b, *map(value, args))
        elif opcode == "mul.rn.f16x2":
            result = _lanes(lambda a, b: a * b, *map(value, args))
        elif opcode == "fma.rn.f16x2":
            result = _lanes(lambda a, b, c: a * b + c, *map(value, args))
        elif opcode == "cvt.f32.f16":
            result = np.float32(value(args[0]))
        elif opcode == "add.rn.f32":
            result = np.float32(value(args[0]) + value(args[1]))
        else:
            raise AssertionError(f"the evaluator does not know {opcode}")
        regs[dest] = result
    return float(regs["$0"])


@triton.jit
def _interpreter_steps(words_ptr, x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    words = tl.load(words_ptr + offs)
    x = [half2_pairs(tl.load(x_ptr + offs * 8 + i), tl.load(x_ptr + offs * 8 + i + 4)) for i in tl.static_range(4)]
    tl.store(out_ptr + offs, word_dots_half2(words, x[0], x[1], x[2], x[3], False))


@pytest.fixture(scope="module")
def cases() -> tuple[np.ndarray, np.ndarray]:
    """Words of every bit pattern (the sign bit too) and signed inputs of several magnitudes, up to
    thousands, where a sum of 4 products would overflow fp16 if the levels were not scaled by 1/8."""
    rng = np.random.default_rng(0)
    words = rng.integers(-2 ** 31, 2 ** 31, 64, dtype=np.int64).astype(np.int32)
    words[:4] = [0, -1, 0x76543210, -0x789ABCDF]
    x = (rng.standard_normal((64, 8)) * rng.choice([0.01, 1.0, 30.0, 4000.0], (64, 1))).astype(np.float16)
    return words, x


def test_the_ptx_computes_what_the_interpreter_runs_bit_for_bit(cases):
    words, x = cases
    out = torch.empty(len(words))
    _interpreter_steps[(1,)](torch.from_numpy(words), torch.from_numpy(x.reshape(-1)), out, N=len(words))
    for j, word in enumerate(words):
        inputs = [int(word) & 0xFFFFFFFF] + [_pack(x[j, i], x[j, i + 4]) for i in range(4)]
        assert run_ptx(_WORD_DOT_PTX.value, inputs) == out[j].item(), j


def test_the_ptx_sums_each_centred_level_times_its_input_over_a_word(cases):
    words, x = cases
    for j, word in enumerate(words):
        levels = [(int(word) & 0xFFFFFFFF) >> (4 * i) & 0xF for i in range(8)]
        exact = sum((level + LEVEL_OFFSET.value) * LEVEL_UNIT.value * float(x[j, i]) for i, level in enumerate(levels))
        inputs = [int(word) & 0xFFFFFFFF] + [_pack(x[j, i], x[j, i + 4]) for i in range(4)]
        # two lanes of 4 fp16 roundings each, a partial sum at most 4 |x|
        bound = 8 * 2.0 ** -11 * 4 * np.abs(x[j].astype(np.float64)).max()
        assert abs(run_ptx(_WORD_DOT_PTX.value, inputs) - exact) <= bound, (j, levels)
