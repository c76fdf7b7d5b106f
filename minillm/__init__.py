"""minillm: a compact, complete LLM inference engine, built up in a notebook course."""

from __future__ import annotations

import importlib

from minillm.version import __version__

# Imported on first use, so that `minillm.version` or `minillm.course.setup` do not load the engine.
_EXPORTS = {"LLM": "minillm.llm", "SamplingParams": "minillm.sampling_params", "RequestOutput": "minillm.outputs",
            "CompletionOutput": "minillm.outputs", "Logprob": "minillm.outputs", "RequestMetrics": "minillm.outputs"}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'minillm' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
