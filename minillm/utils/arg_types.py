"""argparse types that check a value as the command line is parsed, so that a bad value is refused in
a second, before any model is loaded (loading one takes from seconds to minutes)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from minillm.utils.validation import check_int


def parsed_by(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type from a parser that raises ValueError, keeping its message."""

    def parse_arg(text: str) -> object:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse_arg


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in [low, high] (high None: no upper end), e.g. `type=int_in(1)` for a count."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be an integer, got {text!r}") from None
        check_int("the value", value, low, high)
        return value

    return parsed_by(parse)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"must be JSON, e.g. '{{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}' "
                         f"({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {text!r}")
    return value


json_object = parsed_by(_json_object)  # a JSON object, as vLLM's --speculative-config takes one
