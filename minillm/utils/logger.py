"""The package's logger: INFO lines to stderr, as vLLM prints its start-up figures (quiet them with
MINILLM_LOGGING_LEVEL=WARNING)."""

from __future__ import annotations

import logging
import os


def init_logger(name: str) -> logging.Logger:
    root = logging.getLogger("minillm")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("minillm: %(message)s"))
        root.addHandler(handler)
        root.setLevel(os.environ.get("MINILLM_LOGGING_LEVEL", "INFO").upper())
        root.propagate = False
    return logging.getLogger(name)
