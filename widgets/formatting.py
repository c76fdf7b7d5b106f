"""Numbers and tokens as the views print them: one formatter per kind of quantity, shared by titles,
hover text and reprs, so that the same number reads the same everywhere."""

from __future__ import annotations

import re

import numpy as np

# Decimal (SI) prefixes, as plotly's "~s" tick format uses them, so axis ticks and text agree.
_BYTE_UNITS = ("kB", "MB", "GB", "TB", "PB")


def format_bytes(n: int | float) -> str:
    """`format_bytes(1234567) -> "1.2 MB"`; whole bytes below 1 kB (`"999 B"`)."""
    if round(n) < 1000:
        return f"{round(n)} B"
    value = n / 1000
    for unit in _BYTE_UNITS[:-1]:
        # Move up only when the rounded value would read 1000 or more (999_960 B is "1.0 MB").
        if round(value, 1) < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} {_BYTE_UNITS[-1]}"


def format_percent(fraction: float) -> str:
    """A share as a percentage, 2 significant digits, never in exponent form:
    `format_percent(5.2e-7) -> "0.000052%"` (a small cache on a big device is the usual case)."""
    percent = np.format_float_positional(fraction * 100, precision=2, fractional=False, trim="-")
    return f"{percent}%"



VISIBLE_SPACE = "␣"
RUN = 4  # spaces in a row from which a run is written with its count: ␣×7 reads better than ␣␣␣␣␣␣␣


def format_token(text: str) -> str:
    """A token's text as a chart label that shows its whitespace, which an SVG label would collapse
    (every run of spaces drawn as one): a space is "␣", a run of 4 or more "␣×N", and a newline, a
    tab or another unprintable character its Python escape: `format_token("\\n       ") -> "\\n␣×7"`."""
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return re.sub(" +", lambda m: f"{VISIBLE_SPACE}×{len(m[0])}" if len(m[0]) >= RUN else VISIBLE_SPACE * len(m[0]),
                  escaped)
