"""`speculative_config`, vLLM's dict: {"model": ..., "num_speculative_tokens": k} (a draft model) or
{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from minillm.utils.validation import check_choice, check_int

SPECULATIVE_METHODS = ("draft_model", "ngram")
# Verifying k drafts costs a target step of k + 1 tokens whatever is accepted; past a few tokens the
# chance that all are accepted is tiny, so a bigger k only adds work.
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 64


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None  # the draft model: "tiny-draft", a local folder or a Hub id
    prompt_lookup_max: int = 4  # ngram: the longest suffix of the sequence looked up earlier in it
    prompt_lookup_min: int = 1  # ngram: the shortest

    @classmethod
    def from_dict(cls, config: Any) -> SpeculativeConfig | None:
        """None stays None: no speculation."""
        if config is None:
            return None
        if isinstance(config, SpeculativeConfig):
            return config
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict or None, got {type(config).__name__}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(config) - known):
            raise ValueError(f"speculative_config has unknown key(s) {unknown}; accepted: {sorted(known)}")
        values = dict(config)
        if "num_speculative_tokens" not in values:
            raise ValueError("speculative_config['num_speculative_tokens'] is required (k, the draft tokens per step)")
        # A model implies the draft-model method, as in vLLM.
        values.setdefault("method", "draft_model" if values.get("model") is not None else None)
        return cls(**values)

    def __post_init__(self) -> None:
        check_choice("speculative_config['method']", self.method, SPECULATIVE_METHODS)
        check_int("speculative_config['num_speculative_tokens']", self.num_speculative_tokens, 1,
                  MAX_SPECULATIVE_TOKENS)
        if self.method == "draft_model":
            if not isinstance(self.model, str) or not self.model.strip():
                raise ValueError("speculative_config['model'] must name the draft model (a string) for method "
                                 f"'draft_model', got {self.model!r}")
        elif self.model is not None:
            raise ValueError(f"speculative_config['model'] must be None for method {self.method!r}, got {self.model!r}")
        check_int("speculative_config['prompt_lookup_max']", self.prompt_lookup_max, 1, MAX_PROMPT_LOOKUP)
        check_int("speculative_config['prompt_lookup_min']", self.prompt_lookup_min, 1, self.prompt_lookup_max)
