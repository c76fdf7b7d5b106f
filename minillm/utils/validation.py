"""Strict checks of engine arguments: each failure is a ValueError naming the argument, what it
accepts and what it got. Strict means True is not an integer and "8" is not a number."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def check_int(name: str, value: Any, low: int | None = None, high: int | None = None, *,
              power_of_two: bool = False, optional: bool = False) -> None:
    """value must be an int in [low, high] (either end open if None), a power of two if asked, or
    None if optional."""
    if optional and value is None:
        return
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    ok = ok and (not power_of_two or value & (value - 1) == 0)
    if not ok:
        kind = "a power of two" if power_of_two else "an integer"
        raise ValueError(f"{name} must be {kind}{_range(low, high)}{' or None' if optional else ''}, got {value!r}")


def check_number(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> None:
    """value must be an int or float in [low, high], or (low, high] with low_open."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if not ok:
        raise ValueError(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value!r}")


def check_choice(name: str, value: Any, choices: Collection[Any]) -> None:
    if isinstance(value, bool) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def _range(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    return f" <= {high}" if high is not None else ""
