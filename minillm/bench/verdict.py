"""Conclusions drawn from repeated timings, never from one.

A timing on a shared machine is the work plus whatever else the machine was doing. So a
conclusion is drawn from several runs: their median, and their spread as the middle half of the
runs (first to third quartile). A comparison with a threshold is decided only when that whole
band lies on one side of it; a band across the threshold is `Verdict.NOISY`, and the sentence
printed is "too noisy to conclude" rather than whichever side one lucky run fell on.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_SAMPLES = 3  # fewer runs give no spread to judge by
NOISY_NOTE = "too noisy to conclude: rerun on a quiet machine"


@dataclass(frozen=True)
class Estimate:
    """A measured quantity: the median of its runs and the band of their middle half."""

    median: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        """The band's width relative to the median (0.1: the middle half of the runs within 10%)."""
        return (self.high - self.low) / self.median

    # Arithmetic carries the band as an interval (the quantities are positive): a ratio pairs each
    # low with the other's high, so that the band holds whichever runs of the two belong together.
    def __truediv__(self, other: Estimate) -> Estimate:
        return Estimate(self.median / other.median, self.low / other.high, self.high / other.low)

    def __rtruediv__(self, number: float) -> Estimate:
        return Estimate(number / self.median, number / self.high, number / self.low)

    def __mul__(self, number: float) -> Estimate:
        return Estimate(self.median * number, self.low * number, self.high * number)

    __rmul__ = __mul__

    def __add__(self, other: Estimate) -> Estimate:
        return Estimate(self.median + other.median, self.low + other.low, self.high + other.high)

    def factor(self) -> str:
        """The estimate as a factor, with its band: '2.3x (middle half of the runs 2.1x to 2.5x)'."""
        digits = 2 if self.median < 10 else 1
        return f"{self.median:.{digits}f}x (middle half of the runs {self.low:.{digits}f}x to {self.high:.{digits}f}x)"


def estimate(samples: Sequence[float]) -> Estimate:
    """The median and quartile band of `samples`: at least MIN_SAMPLES finite positive numbers."""
    values = [float(s) for s in samples]
    if len(values) < MIN_SAMPLES:
        raise ValueError(f"samples: need at least {MIN_SAMPLES} runs to judge their spread, got {len(values)}")
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"samples: every run must be a finite positive number, got {values}")
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return Estimate(median, low, high)


class Verdict(enum.Enum):
    ABOVE = "above"
    BELOW = "below"
    NOISY = "noisy"


def verdict(value: Estimate, threshold: float) -> Verdict:
    """Which side of `threshold` the whole band of `value` lies on, or NOISY when it straddles it.
    A margin is stated by the threshold itself: "grew by more than 25%" is a threshold of 1.25."""
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold: must be a finite positive number, got {threshold}")
    if value.low > threshold:
        return Verdict.ABOVE
    if value.high < threshold:
        return Verdict.BELOW
    return Verdict.NOISY
