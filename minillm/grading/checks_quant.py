"""Checks for exercise 06, INT4 weight quantization: the learner's `quantize_int4` (group-wise,
asymmetric, unpacked levels), `pack_int4` / `unpack_int4` (two levels per byte, low nibble first),
`dequantize_int4`, and all of them serving in the real engine.

Expected values come from minillm.quant.int4. A wrong answer is compared with what the common
mistakes produce (symmetric levels, one group per row, 16 steps instead of 15, a range that leaves
out zero, floor instead of round, swapped nibbles), so that the message can name the mistake.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner, shape
from minillm.kernels.ops import load_ops
from minillm.layers.quant_linear import QuantLinear, decoder_linears
from minillm.llm import LLM
from minillm.models.loader import load_model
from minillm.quant import int4, matmul_reference

# (rows, inputs, group size, what is special about it)
CASES = ((4, 64, 32, "two groups per row"),
         (3, 128, 128, "one group per row"),
         (5, 96, 32, "three groups per row, an outlier in one"),
         (3, 64, 64, "a group of positive weights only, a group of equal weights, and a group of zeros"))


def _weight(rows: int, inputs: int, group_size: int, seed: int) -> torch.Tensor:
    """Signed, off-centre groups of different widths; case 2 plants an outlier, case 3 a group with
    no negative weight (its range must still reach down to 0), a constant group, and a group of zeros
    (a pruned or padded row: hi - lo = 0, so an unclamped scale of 0 makes its zero point 0 / 0)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, inputs, generator=g) * torch.rand(rows, 1, generator=g) + 0.3 * torch.randn(
        rows, inputs // group_size, 1, generator=g).repeat_interleave(group_size, 1).view(rows, inputs)
    if seed == 2:
        w[1, 40] = 12.0
    if seed == 3:
        w[0, :group_size] = w[0, :group_size].abs() + 0.5
        w[1, :group_size] = -0.75
        w[2, :group_size] = 0.0
    return w


def _case(rows: int, inputs: int, group_size: int, label: str) -> str:
    return f"weight [{rows}, {inputs}], group_size={group_size} ({label})"


def _reference(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    packed, scales, zeros = int4.quantize_int4(w, group_size)
    return int4.unpack_int4(packed), scales, zeros


def _mistakes(w: torch.Tensor, group_size: int) -> dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]:
    """hint -> (scales, zeros) that a common mistake gives; None where it can give any."""
    rows, inputs = w.shape
    groups = w.view(rows, inputs // group_size, group_size)
    lo, hi = groups.amin(dim=2), groups.amax(dim=2)
    lo0, hi0 = lo.clamp(max=0), hi.clamp(min=0)  # the range widened to include 0, as it should be
    scales = ((hi0 - lo0) / 15).clamp(min=1e-8)
    row_lo, row_hi = w.amin(dim=1, keepdim=True).clamp(max=0), w.amax(dim=1, keepdim=True).clamp(min=0)
    return {
        # Whatever the scale (absmax / 7, / 7.5, / 8), a symmetric scheme puts every zero point at 8.
        "symmetric levels around a fixed zero point (asymmetric: zero = round(-lo / scale), from the group's "
        "own minimum)": (None, torch.full_like(lo, 8.0)),
        "16 steps (scale = (hi - lo) / 16); 16 levels have 15 steps between them: scale = (hi - lo) / 15":
            ((hi0 - lo0) / 16, torch.round(-lo0 * 16 / (hi0 - lo0))),
        "a range that does not include 0: clamp lo to at most 0 and hi to at least 0, so that 0 is a level":
            ((hi - lo).clamp(min=1e-8) / 15, torch.round(-lo / ((hi - lo).clamp(min=1e-8) / 15))),
        "floor instead of round: zero = round(-lo / scale), to the nearest level (floor cuts every value down)":
            (scales, torch.floor(-lo0 / scales)),
        "one scale per row: the range must be taken per group of group_size inputs":
            (((row_hi - row_lo) / 15).expand(rows, inputs // group_size), None),
    }


def _explain(w: torch.Tensor, group_size: int, scales: torch.Tensor, zeros: torch.Tensor) -> str:
    if not torch.isfinite(zeros).all():
        return ("a zero point is NaN or inf: a group whose weights are all 0 has hi - lo = 0, so scale = 0 and "
                "-lo / scale = 0 / 0; clamp the scale to a tiny minimum, ((hi - lo) / 15).clamp(min=1e-8)")
    for hint, (s, z) in _mistakes(w, group_size).items():
        # The zero point of a mistake may or may not have been clamped to [0, 15], as the recipe's is.
        if (s is None or s.shape == scales.shape and torch.allclose(scales.float(), s, rtol=1e-4, atol=1e-7)) and (
                z is None or any(torch.allclose(zeros.float(), v) for v in (z, z.clamp(0, 15)))):
            return hint
    return ("scale = (hi - lo) / 15 with lo = min(group, 0) and hi = max(group, 0); zero = round(-lo / "
            "scale); q = clamp(round(w / scale) + zero, 0, 15)")


def check_quantize(quantize_int4: Callable) -> None:
    """quantize_int4(weight, group_size) -> (q uint8 [out, in] in 0..15, scales, zeros [out, in // group_size])."""
    for seed, (rows, inputs, group_size, label) in enumerate(CASES):
        case = _case(rows, inputs, group_size, label)
        w = _weight(rows, inputs, group_size, seed)
        want_q, want_s, want_z = _reference(w, group_size)
        got = call_learner(quantize_int4, "quantize_int4", case, w.clone(), group_size)
        if not (isinstance(got, tuple) and len(got) == 3):
            raise CheckFailed(f"quantize_int4 returned {type(got).__name__}; expected a tuple (q, scales, zeros)\n"
                              f"  on input: {case}")
        q, scales, zeros = got
        for name, have, want in (("q", q, want_q), ("scales", scales, want_s), ("zeros", zeros, want_z)):
            if not isinstance(have, torch.Tensor) or have.shape != want.shape:
                raise CheckFailed(f"quantize_int4 returned {name} of shape {shape(have)}; expected {shape(want)}"
                                  f" ({'one per weight' if name == 'q' else 'one per row and group'})\n"
                                  f"  on input: {case}")
        if q.dtype != torch.uint8 or scales.dtype != w.dtype or zeros.dtype != w.dtype:
            raise CheckFailed(f"quantize_int4 returned q {q.dtype}, scales {scales.dtype}, zeros {zeros.dtype}; "
                              f"expected torch.uint8, and the weight's {w.dtype} for both\n  on input: {case}")
        if not torch.allclose(scales, want_s, rtol=1e-5, atol=1e-8) or not torch.equal(zeros, want_z):
            raise CheckFailed(f"quantize_int4's scales or zero points differ from the expected ones\n"
                              f"  on input: {case}\n  likely mistake: {_explain(w, group_size, scales, zeros)}")
        # A level may differ where w / scale lands within rounding of a tie; nowhere else.
        off = q.int() != want_q.int()
        exact = w.view(rows, -1, group_size) / want_s[..., None]
        tie = ((exact - exact.floor() - 0.5).abs() < 1e-4).view(rows, inputs)
        if (off & ~tie).any():
            r, c = (off & ~tie).nonzero()[0].tolist()
            diff = q[r, c].int() - want_q[r, c].int()
            hint = ("round to the nearest level (floor cuts every value down)" if diff < 0 else
                    "clamp q to [0, 15]" if q.max() > 15 else "q = clamp(round(w / scale) + zero, 0, 15)")
            raise CheckFailed(f"quantize_int4 gives weight [{r}, {c}] = {w[r, c].item():.4f} the level "
                              f"{q[r, c].item()}; expected {want_q[r, c].item()} (scale "
                              f"{want_s[r, c // group_size]:.4g}, zero {want_z[r, c // group_size]:.0f})\n"
                              f"  on input: {case}\n  hint: {hint}")
    # Clamping q matters only where round(w / scale) and zero = round(-lo / scale) both round up: at a
    # tie, which the comparison above forgives. A group whose range is symmetric, with an exact scale,
    # puts its largest weight there: 3.75 / 0.5 = 7.5 -> 8, plus zero 8 -> 16, unless clamped.
    w = torch.linspace(-3.75, 3.75, 32).repeat(2, 1)
    case = "weight [2, 32] from -3.75 to 3.75 in every row, group_size=32 (scale 0.5, and -lo / scale = 7.5)"
    q = call_learner(quantize_int4, "quantize_int4", case, w.clone(), 32)[0]
    if q.int().min() < 0 or q.int().max() > 15:
        raise CheckFailed(f"quantize_int4 gives levels from {q.int().min().item()} to {q.int().max().item()}; "
                          f"4 bits hold 0..15\n  on input: {case}\n  hint: clamp q to [0, 15]")
    print(f"check_quantize passed: {len(CASES)} weights, levels, scales and zero points as expected")


def check_pack(pack_int4: Callable, unpack_int4: Callable, dequantize_int4: Callable) -> None:
    """pack_int4(q) -> uint8 [out, in // 2]; unpack_int4(packed) -> q; dequantize_int4(packed, scales,
    zeros, group_size) -> weight, all exact against minillm's."""
    g = torch.Generator().manual_seed(7)
    for seed, (rows, inputs, group_size, label) in enumerate(CASES):
        case = _case(rows, inputs, group_size, label)
        q = torch.randint(0, 16, (rows, inputs), generator=g, dtype=torch.uint8)
        want = int4.pack_int4(q)
        packed = call_learner(pack_int4, "pack_int4", case, q.clone())
        if not isinstance(packed, torch.Tensor) or packed.shape != want.shape or packed.dtype != torch.uint8:
            raise CheckFailed(f"pack_int4 returned {shape(packed)} {getattr(packed, 'dtype', '')}; expected "
                              f"torch.uint8 {shape(want)}: two levels per byte\n  on input: q {shape(q)}")
        if not torch.equal(packed, want):
            swapped = torch.equal(packed, q[:, 1::2] | (q[:, 0::2] << 4))
            hint = ("the nibbles are swapped: input 2j goes to the low nibble (bits 0-3), input 2j + 1 to the "
                    "high nibble (bits 4-7)" if swapped else
                    "byte j of a row = q[:, 2j] | (q[:, 2j + 1] << 4)")
            raise CheckFailed(f"pack_int4 packs differently from the layout the engine reads\n  on input: "
                              f"q {shape(q)}, first row {q[0, :4].tolist()} ... -> expected bytes "
                              f"{want[0, :2].tolist()} ..., got {packed[0, :2].tolist()} ...\n  hint: {hint}")
        back = call_learner(unpack_int4, "unpack_int4", case, want.clone())
        if not isinstance(back, torch.Tensor) or back.shape != q.shape or not torch.equal(back.to(torch.uint8), q):
            raise CheckFailed(f"unpack_int4(pack_int4(q)) is not q\n  on input: packed {shape(want)}, first bytes "
                              f"{want[0, :2].tolist()} -> expected {q[0, :4].tolist()}, got "
                              f"{back[0, :4].tolist() if isinstance(back, torch.Tensor) else back!r}\n"
                              "  hint: low nibble packed & 0xF first, then high nibble packed >> 4, interleaved")
        w = _weight(rows, inputs, group_size, seed)
        packed_w, scales, zeros = int4.quantize_int4(w, group_size)
        want_w = int4.dequantize_int4(packed_w, scales, zeros, group_size)
        got_w = call_learner(dequantize_int4, "dequantize_int4", case, packed_w.clone(), scales, zeros, group_size)
        if not isinstance(got_w, torch.Tensor) or got_w.shape != want_w.shape:
            raise CheckFailed(f"dequantize_int4 returned {shape(got_w)}; expected {shape(want_w)}\n  on input: {case}")
        if not torch.allclose(got_w, want_w, rtol=1e-6, atol=1e-7):
            scaled = int4.unpack_int4(packed_w).view(rows, -1, group_size).float() * scales[..., None]
            # Without the zero point, or with it subtracted after scaling, as if it were in weight units.
            zero_point_missed = (scaled, scaled - zeros[..., None])
            hint = ("subtract the zero point before scaling: (q - zero) * scale; the zero point counts levels, "
                    "not weight units" if any(torch.allclose(got_w, v.flatten(1)) for v in zero_point_missed) else
                    "each group of group_size inputs has its own scale and zero: (q - zero) * scale, group by group")
            raise CheckFailed(f"dequantize_int4 does not give back the expected weights\n  on input: {case}\n"
                              f"  hint: {hint}")
    print(f"check_pack passed: {len(CASES)} inputs packed, unpacked and dequantized exactly")


def check_engine(quantize_int4: Callable, pack_int4: Callable, dequantize_int4: Callable, llm: LLM) -> None:
    """The int4 model rebuilt with the learner's functions: every decoder layer quantized and packed
    by them from the checkpoint's weights, and their dequantize_int4 in every forward pass,
    generates what minillm's int4 model does."""
    engine = llm.llm_engine
    layers = {name: m for name, m in decoder_linears(engine.model) if isinstance(m, QuantLinear)}
    if not layers or any(m.method != "int4" for m in layers.values()) or engine.model_config.quantization:
        raise CheckFailed("this check needs an int4 model quantized from an unquantized checkpoint: "
                          "LLM(model, dtype='float32', quantization='int4')")
    original = dict(decoder_linears(load_model(engine.model_path, engine.model_config, engine.dtype, engine.device)))
    yours = {}  # the engine's packed weight (by identity) -> the learner's tensors for that layer
    for name, layer in layers.items():
        case = f"layer {name}, weight {shape(original[name].weight)}, group_size={layer.group_size}"
        q, scales, zeros = call_learner(quantize_int4, "quantize_int4", case, original[name].weight, layer.group_size)
        packed = call_learner(pack_int4, "pack_int4", case, q)
        for buffer, value in (("qweight", packed), ("scales", scales), ("zeros", zeros)):
            if not isinstance(value, torch.Tensor) or value.shape != getattr(layer, buffer).shape:
                raise CheckFailed(f"for {case}, your functions give {buffer} {shape(value)}; the engine "
                                  f"expects {shape(getattr(layer, buffer))}")
        yours[id(layer.qweight)] = (packed, scales, zeros)

    def serve_yours(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
        return dequantize_int4(*yours[id(packed)], group_size)

    # The reference run reads minillm's packed weights; the learner's run, in the same layers, theirs.
    # Both on the PyTorch matmul, the one that calls dequantize_int4 (a GPU would pick Triton's).
    engine_ops = {name: layer.ops for name, layer in layers.items()}
    try:
        for layer in layers.values():
            layer.ops = load_ops("torch")
        compared = check_generation(llm, matmul_reference, "dequantize_int4", int4.dequantize_int4, serve_yours,
                                    "dequantize_int4")
    finally:
        for name, layer in layers.items():
            layer.ops = engine_ops[name]
    print(f"check_engine passed: {len(layers)} layers quantized and packed by your functions, your "
          f"dequantize_int4 in every forward pass; {compared}")
