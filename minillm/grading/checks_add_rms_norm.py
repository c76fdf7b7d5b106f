"""Checks for exercise 08, part 5: the learner's `fused_add_rms_norm` (a Triton kernel and the given
launcher, with the signature of `layer_reference.fused_add_rms_norm_ref`) against the reference, then
as the engine's norm in every decoder layer.

The cases tell the usual mistakes apart: the new residual is checked on its own; rows of tiny values
show eps in the wrong place (outside the root it dwarfs the root of a tiny mean); fp16 rows of
values in the hundreds overflow a sum of squares taken in fp16; and in fp16 the weight multiply
rounds differently when it happens before the cast back instead of after, which transformers'
order (and the engine's bf16 parity with it) depends on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minillm.grading.engine_check import check_generation
from minillm.grading.feedback import CheckFailed, call_learner, check_tensor
from minillm.kernels.layer_reference import fused_add_rms_norm_ref
from minillm.llm import LLM

EPS = 1e-5
# (rows, dim, dtype, scale of the values): ragged widths (not powers of two), then the cases above.
CASES = [(3, 64, torch.float32, 1.0), (5, 200, torch.float32, 3.0), (2, 96, torch.float32, 1e-3),
         (4, 256, torch.float16, 300.0), (64, 512, torch.float16, 1.0)]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3}  # relative to the largest output
# fp16 outputs that may differ from the reference's by rounding alone (the sum of squares is taken in
# another order): a few in ten thousand. The weight applied before the cast changes about one in ten.
MAX_ROUNDING_DIFFERENCES = 0.01


def _inputs(rows: int, dim: int, dtype: torch.dtype, scale: float, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(rows, dim, generator=g) * scale for _ in range(2))
    weight = torch.rand(dim, generator=g) + 0.5
    return x.to(dtype).to(device), residual.to(dtype).to(device), weight.to(dtype).to(device)


def _unpack(got, expected, described: str):
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed(f"fused_add_rms_norm returned {type(got).__name__}; expected a tuple (out, residual): the "
                          f"normalised sum and the sum itself\n  on input: {described}")
    out = check_tensor(got[0], expected[0], "fused_add_rms_norm's out", described,
                       "is eps added inside the root, and the sum of squares taken in float32?")
    residual = check_tensor(got[1], expected[1], "fused_add_rms_norm's residual", described,
                            "the residual is x + residual, stored before it is normalised")
    return out, residual


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def _hint(errors: list[float]) -> str:
    """Which cases are wrong says which mistake it is."""
    wrong = [e > TOLERANCE[dtype] for e, (_, _, dtype, _) in zip(errors, CASES)]
    tiny = [scale < 0.01 for *_, scale in CASES]
    huge = [dtype == torch.float16 and scale >= 100 for _, _, dtype, scale in CASES]
    if any(w and t for w, t in zip(wrong, tiny)) and all(e < 1e-3 for e, t, h in zip(errors, tiny, huge)
                                                         if not t and not h):
        return ("rows of tiny values are far off and the others nearly right: eps goes inside the root, "
                "rsqrt(mean(x^2) + eps); outside it, it outweighs the root of a tiny mean")
    if any(w and h for w, h in zip(wrong, huge)) and not any(w for w, h in zip(wrong, huge) if not h):
        return ("only the fp16 rows of values in the hundreds are wrong: take the sum of squares in float32 "
                "(total.to(tl.float32)); in fp16 a square above 65,504 is infinite")
    return "out = weight * (s / sqrt(mean(s^2) + eps)) where s = x + residual, the mean taken over the row"


def check_fused_add_rms_norm(fused_add_rms_norm: Callable) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    errors, results = [], []
    for case, (rows, dim, dtype, scale) in enumerate(CASES):
        x, residual, weight = _inputs(rows, dim, dtype, scale, case, device)
        kept = residual.clone()
        described = f"{rows} rows of {dim} {str(dtype).removeprefix('torch.')} values of about {scale:g}"
        expected = fused_add_rms_norm_ref(x.clone(), residual.clone(), weight, EPS)  # in place: on copies
        got = call_learner(fused_add_rms_norm, "fused_add_rms_norm", described, x, residual, weight, EPS)
        out, new_residual = _unpack(got, expected, described)
        if not torch.equal(residual, kept):
            raise CheckFailed(f"fused_add_rms_norm changed its residual input\n  on input: {described}\n"
                              "  hint: write the sum to residual_out_ptr, not back over residual_ptr")
        if _relative(new_residual, expected[1]) > TOLERANCE[dtype]:
            raise CheckFailed(f"the residual returned is not x + residual\n  on input: {described}\n"
                              "  hint: store the sum (rounded to the inputs' dtype) to residual_out_ptr: the next "
                              "layer adds its output to it")
        errors.append(_relative(out, expected[0]) if torch.isfinite(out).all() else float("inf"))
        results.append((described, out, expected[0]))
    worst = max(range(len(CASES)), key=lambda i: errors[i] / TOLERANCE[CASES[i][2]])
    if errors[worst] > TOLERANCE[CASES[worst][2]]:
        raise CheckFailed(f"out differs from the reference by {errors[worst]:.2g} of its largest value (tolerance "
                          f"{TOLERANCE[CASES[worst][2]]})\n  on input: {results[worst][0]}\n  hint: {_hint(errors)}")
    for (described, out, expected), (_, _, dtype, _) in zip(results, CASES):
        differing = (out != expected).float().mean().item()
        if dtype == torch.float16 and differing > MAX_ROUNDING_DIFFERENCES:
            raise CheckFailed(f"{differing:.0%} of the fp16 outputs round differently from the reference\n"
                              f"  on input: {described}\n  hint: cast the normalised row back to the inputs' "
                              "dtype first, then multiply by the weight (transformers' order: weight * "
                              "x.to(input_dtype)), so that the product is rounded where the reference rounds it")
    print(f"check_fused_add_rms_norm passed: {len(CASES)} cases (fp32 and fp16, widths 64 to 512, values from "
          "1e-3 to 300) against the reference")


def check_engine(fused_add_rms_norm: Callable, model: str, device: str) -> None:
    """Greedy generation with the learner's kernel as every decoder layer's add-and-norm. Eager
    steps: a replayed CUDA graph would run the kernel captured with it, not the learner's."""
    llm = LLM(model, dtype="float32", device=device, enforce_eager=True)
    ops = llm.llm_engine.ops
    done = check_generation(llm, ops, "fused_add_rms_norm", fused_add_rms_norm_ref, fused_add_rms_norm,
                            "fused_add_rms_norm")
    print(f"check_engine passed: with your kernel in every decoder layer, {done}")
