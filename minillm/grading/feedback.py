"""How a check talks to a learner: one exception type, and the phrases every check message is built
from (tensor shapes, which positions and heads are wrong), so that all chapters read alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

# Looser than float32 rounding of a different summation order (about 1e-6 here), far tighter than
# any real mistake, which moves outputs by O(1) on unit-variance inputs.
ATOL = 1e-4
RTOL = 1e-4


class CheckFailed(AssertionError):
    """A check's verdict: what was expected, on which input, and a hint."""


def shape(t: Any) -> str:
    return f"[{', '.join(map(str, t.shape))}]" if isinstance(t, torch.Tensor) else type(t).__name__


def spans(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0..2, 5, 7..8': position lists stay short in a message."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}..{r[-1]}" for r in runs)


def call_learner(fn: Callable, name: str, case: str, *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function; an exception becomes a CheckFailed that names the input."""
    try:
        return fn(*args, **kwargs)
    except CheckFailed:
        raise
    except Exception as e:
        # Triton's interpreter wraps what a kernel raised; the stub's error is its cause.
        if isinstance(e, NotImplementedError) or isinstance(e.__cause__, NotImplementedError):
            raise CheckFailed(f"{name} is not implemented yet: replace `raise NotImplementedError()` "
                              "with your code") from None
        raise CheckFailed(f"{name} raised {type(e).__name__}: {e}\n  on input: {case}") from e


def check_tensor(got: Any, like: torch.Tensor, name: str, case: str, nan_hint: str) -> torch.Tensor:
    """The learner returned a tensor of the expected shape and dtype, free of NaN (nan_hint: where
    NaN usually comes from in this exercise)."""
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{name} returned {type(got).__name__}; expected a tensor of shape "
                          f"{shape(like)}\n  on input: {case}")
    if got.shape != like.shape:
        raise CheckFailed(f"{name} returned shape {shape(got)}; expected {shape(like)}\n  on input: {case}")
    if got.dtype != like.dtype:
        raise CheckFailed(f"{name} returned dtype {got.dtype}; expected {like.dtype}, the inputs' dtype "
                          f"(the engine runs in the model's dtype)\n  on input: {case}")
    if torch.isnan(got).any():
        raise CheckFailed(f"{name} returned NaN\n  on input: {case}\n  hint: {nan_hint}")
    return got


def mismatch(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Boolean tensor of the elements outside tolerance, same shape as the inputs."""
    return (got.detach().cpu().float() - expected.float()).abs() > ATOL + RTOL * expected.float().abs()
