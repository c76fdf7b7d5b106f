"""Exercise 06's checks: they pass minillm's int4 functions and an independently written version,
name the common mistakes of quantizing, packing and dequantizing, refuse the untouched exercise,
and the engine check leaves the int4 model exactly as it found it, even when the learner's code
raises."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from minillm import LLM
from minillm.grading import checks_quant as checks
from minillm.grading.feedback import CheckFailed
from minillm.kernels.ops import load_ops
from minillm.layers.quant_linear import QuantLinear
from minillm.quant import int4, matmul_reference

ORIGINAL_DEQUANTIZE = matmul_reference.dequantize_int4


# minillm's functions, as the exercise asks for them: quantize_int4 returns the levels unpacked.
def reference_quantize(weight, group_size):
    packed, scales, zeros = int4.quantize_int4(weight, group_size)
    return int4.unpack_int4(packed), scales, zeros


def quantize_with(symmetric=None, steps=15, include_zero=True, per_row=False, round_level=torch.round,
                  round_zero=torch.round, clamp_level=True, clamp_zero=True, q_dtype=torch.uint8,
                  precision=None, shift_then_round=False, min_scale=1e-8):
    """quantize_int4 written from the exercise's text, group by group in a Python loop, with none of
    minillm's code; its arguments break one rule (symmetric: the divisor of absmax, zero fixed at 8),
    or take another correct road (precision: compute in float64; shift_then_round: round(w / scale
    + zero), which differs from round(w / scale) + zero only at ties); min_scale=0 leaves a group of
    zeros with scale 0."""
    def quantize_int4(weight, group_size):
        rows, inputs = weight.shape
        width = inputs if per_row else group_size
        q = torch.empty(rows, inputs, dtype=precision or weight.dtype)
        scales, zeros = [], []
        for start in range(0, inputs, width):
            block = weight[:, start:start + width].to(q.dtype)
            if symmetric:
                scale = block.abs().amax(dim=1) / symmetric
                zero = torch.full_like(scale, 8.0)
            else:
                lo, hi = block.amin(dim=1), block.amax(dim=1)
                if include_zero:
                    lo, hi = torch.minimum(lo, torch.zeros_like(lo)), torch.maximum(hi, torch.zeros_like(hi))
                scale = ((hi - lo) / steps).clamp(min=min_scale)
                zero = round_zero(-lo / scale)
                zero = zero.clamp(0, 15) if clamp_zero else zero
            if shift_then_round:
                level = round_level(block / scale[:, None] + zero[:, None])
            else:
                level = round_level(block / scale[:, None]) + zero[:, None]
            q[:, start:start + width] = level.clamp(0, 15) if clamp_level else level
            scales += [scale[:, None]] * (width // group_size)
            zeros += [zero[:, None]] * (width // group_size)
        return q.to(q_dtype), torch.cat(scales, 1).to(weight.dtype), torch.cat(zeros, 1).to(weight.dtype)
    return quantize_int4


def pack_with(swap=False, dtype=torch.uint8):
    def pack_int4(q):
        low, high = q[:, 0::2].long(), q[:, 1::2].long()
        if swap:
            low, high = high, low
        return (low + 16 * high).to(dtype)
    return pack_int4


def unpack_with(high_first=False):
    def unpack_int4(packed):
        q = torch.empty(packed.shape[0], 2 * packed.shape[1], dtype=torch.uint8)
        low, high = packed % 16, packed // 16
        q[:, 0::2], q[:, 1::2] = (high, low) if high_first else (low, high)
        return q
    return unpack_int4


def dequantize_with(zero_point=True, spread="by index"):
    """zero_point: False leaves it out, "after scaling" subtracts it from q * scale; spread: how a
    group's scale and zero reach its inputs; "repeat" tiles the groups instead."""
    def dequantize_int4(packed, scales, zeros, group_size):
        q = unpack_with()(packed).to(scales.dtype)
        if spread == "repeat":
            scale, zero = scales.repeat(1, group_size), zeros.repeat(1, group_size)
        else:
            group = torch.arange(q.shape[1]) // group_size
            scale, zero = scales[:, group], zeros[:, group]
        if zero_point == "after scaling":
            return q * scale - zero
        return (q - zero) * scale if zero_point else q * scale
    return dequantize_int4


def not_implemented(*args):
    raise NotImplementedError()


def per_row_shaped(weight, group_size):
    """One scale per row, returned as one column."""
    q, scales, zeros = quantize_with(per_row=True)(weight, group_size)
    return q, scales[:, :1], zeros[:, :1]


def test_check_quantize_passes_minillms_and_independent_versions(capsys):
    checks.check_quantize(reference_quantize)
    checks.check_quantize(quantize_with())
    checks.check_quantize(quantize_with(precision=torch.float64, shift_then_round=True))
    assert capsys.readouterr().out.count("check_quantize passed") == 3


@pytest.mark.parametrize("wrong, message", [
    (quantize_with(symmetric=7), "likely mistake: symmetric levels around a fixed zero point"),
    (quantize_with(symmetric=7.5), "likely mistake: symmetric levels around a fixed zero point"),
    (quantize_with(steps=16), "likely mistake: 16 steps"),
    (quantize_with(steps=16, clamp_zero=False), "likely mistake: 16 steps"),
    (quantize_with(include_zero=False), "likely mistake: a range that does not include 0"),
    (quantize_with(include_zero=False, clamp_zero=False), "likely mistake: a range that does not include 0"),
    (quantize_with(per_row=True), "likely mistake: one scale per row"),
    (per_row_shaped, r"scales of shape \[4, 1\]; expected \[4, 2\] \(one per row and group\)"),
    (quantize_with(round_level=torch.floor), "hint: round to the nearest level \\(floor cuts every value down"),
    (quantize_with(round_level=torch.floor, round_zero=torch.floor),
     "likely mistake: floor instead of round(?s:.*)floor cuts every value down"),
    (quantize_with(clamp_level=False), r"levels from 0 to 16(?s:.*)hint: clamp q to \[0, 15\]"),
    (quantize_with(min_scale=0.0), r"group of zeros(?s:.*)zero point is NaN(?s:.*)clamp\(min=1e-8\)"),
    (quantize_with(q_dtype=torch.int64), "q torch.int64, .*expected torch.uint8"),
    (lambda weight, group_size: int4.quantize_int4(weight, group_size),
     r"q of shape \[4, 32\]; expected \[4, 64\] \(one per weight\)"),
    (lambda weight, group_size: None, "returned NoneType; expected a tuple"),
    (not_implemented, "quantize_int4 is not implemented yet"),
], ids=["symmetric-absmax/7", "symmetric-absmax/7.5", "16-steps", "16-steps-zero-unclamped", "range-without-0",
        "range-without-0-zero-unclamped", "per-row-scales", "per-row-scales-one-column", "floor-levels",
        "floor-levels-and-zeros", "no-clamp", "scale-0-for-a-group-of-zeros", "int64-levels", "returns-packed",
        "returns-nothing", "stub"])
def test_check_quantize_names_the_mistake(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_quantize(wrong)


def test_no_clamp_matters_only_at_a_tie():
    """What the extra weight of check_quantize is for: on the random weights a missing clamp changes
    nothing, on a symmetric range it stores a 16, which packing then corrupts."""
    for seed, (rows, inputs, group_size, _) in enumerate(checks.CASES):
        w = checks._weight(rows, inputs, group_size, seed)
        assert torch.equal(quantize_with(clamp_level=False)(w, group_size)[0], quantize_with()(w, group_size)[0])
    w = torch.linspace(-3.75, 3.75, 32).repeat(2, 1)
    assert quantize_with(clamp_level=False)(w, 32)[0].max() == 16 and reference_quantize(w, 32)[0].max() == 15


def test_check_pack_passes_minillms_and_independent_versions(capsys):
    checks.check_pack(int4.pack_int4, int4.unpack_int4, int4.dequantize_int4)
    checks.check_pack(pack_with(), unpack_with(), dequantize_with())
    assert capsys.readouterr().out.count("check_pack passed") == 2


@pytest.mark.parametrize("pack, unpack, dequantize, message", [
    (pack_with(swap=True), unpack_with(), dequantize_with(), "the nibbles are swapped"),
    (pack_with(dtype=torch.int64), unpack_with(), dequantize_with(), r"pack_int4 returned \[4, 32\] torch.int64"),
    (pack_with(), unpack_with(high_first=True), dequantize_with(),
     r"unpack_int4\(pack_int4\(q\)\) is not q(?s:.*)hint: low nibble packed & 0xF first"),
    (pack_with(), unpack_with(), dequantize_with(zero_point=False), "subtract the zero point before scaling"),
    (pack_with(), unpack_with(), dequantize_with(zero_point="after scaling"), "subtract the zero point before scaling"),
    (pack_with(), unpack_with(), dequantize_with(spread="repeat"),
     "each group of group_size inputs has its own scale and zero"),
    (not_implemented, unpack_with(), dequantize_with(), "pack_int4 is not implemented yet"),
    (pack_with(), not_implemented, dequantize_with(), "unpack_int4 is not implemented yet"),
    (pack_with(), unpack_with(), not_implemented, "dequantize_int4 is not implemented yet"),
], ids=["swapped-nibbles", "int64-bytes", "unpack-high-nibble-first", "dequantize-without-zero-point",
        "dequantize-zero-point-after-scaling", "dequantize-repeat-not-interleave", "pack-stub", "unpack-stub",
        "dequantize-stub"])
def test_check_pack_names_the_mistake(pack, unpack, dequantize, message):
    with pytest.raises(CheckFailed, match=message):
        checks.check_pack(pack, unpack, dequantize)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", dtype="float32", quantization="int4")


@contextmanager
def left_as_found(llm):
    """The check runs inside; afterwards the int4 model holds the same buffers, every layer its own
    kernel (alternate layers are set to "triton", so that a kernel left at "torch" shows; none runs
    here), and minillm.quant.matmul_reference its own dequantize_int4."""
    engine = llm.llm_engine
    layers = [m for m in engine.model.modules() if isinstance(m, QuantLinear)]
    assert layers and matmul_reference.dequantize_int4 is ORIGINAL_DEQUANTIZE
    own = [m.ops for m in layers]
    kernels = [load_ops("triton") if i % 2 else ops for i, ops in enumerate(own)]
    buffers = [m.qweight for m in layers]
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    free = engine.block_manager.num_free_blocks
    for layer, ops in zip(layers, kernels, strict=True):
        layer.ops = ops
    try:
        yield
    finally:
        after_kernels = [m.ops for m in layers]
        for layer, ops in zip(layers, own, strict=True):
            layer.ops = ops
    assert all(after is ops for after, ops in zip(after_kernels, kernels, strict=True))
    assert matmul_reference.dequantize_int4 is ORIGINAL_DEQUANTIZE
    assert all(m.qweight is b for m, b in zip(layers, buffers, strict=True))
    after = engine.model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
    assert not engine.scheduler.has_unfinished_requests() and engine.block_manager.num_free_blocks == free


@pytest.mark.slow
@pytest.mark.parametrize("functions", [
    (reference_quantize, int4.pack_int4, int4.dequantize_int4),
    (quantize_with(), pack_with(), dequantize_with()),
], ids=["minillm", "independent"])
def test_check_engine_passes_and_leaves_the_model_as_it_was(llm, functions, capsys):
    with left_as_found(llm):
        checks.check_engine(*functions, llm)
    assert "check_engine passed: 24 layers" in capsys.readouterr().out


def raises(*args):
    raise RuntimeError("boom")


@pytest.mark.slow
@pytest.mark.parametrize("quantize, dequantize, message", [
    (reference_quantize, dequantize_with(zero_point=False), "greedy generation differs|log-probability"),
    (reference_quantize, dequantize_with(spread="repeat"), "greedy generation differs|log-probability"),
    (quantize_with(symmetric=7), int4.dequantize_int4, "greedy generation differs|log-probability"),
    (per_row_shaped, int4.dequantize_int4, r"your functions give scales \[\d+, 1\]; the engine expects \[\d+, 2\]"),
    (reference_quantize, raises, "dequantize_int4 raised RuntimeError: boom\n  on input: a call from the engine"),
    (reference_quantize, not_implemented, "dequantize_int4 is not implemented yet"),
    (not_implemented, int4.dequantize_int4, "quantize_int4 is not implemented yet"),
], ids=["dequantize-without-zero-point", "dequantize-repeat", "symmetric-quantize", "per-row-scales",
        "dequantize-raises", "dequantize-stub", "quantize-stub"])
def test_check_engine_fails_a_wrong_function_and_leaves_the_model_as_it_was(llm, quantize, dequantize, message):
    with left_as_found(llm), pytest.raises(CheckFailed, match=message):
        checks.check_engine(quantize, int4.pack_int4, dequantize, llm)


@pytest.mark.slow
def test_check_engine_refuses_a_model_that_is_not_int4(tiny_llm):
    functions = (reference_quantize, int4.pack_int4, int4.dequantize_int4)
    with pytest.raises(CheckFailed, match="needs an int4 model"):
        checks.check_engine(*functions, tiny_llm)
    with pytest.raises(CheckFailed, match="needs an int4 model"):
        checks.check_engine(*functions, LLM("tiny", dtype="float32", quantization="int8"))
