"""What a request brings, checked before anything is queued (vLLM's input processor): its prompt,
tokenized, within the vocabulary and shorter than the context; its sampling parameters, each bounded,
and asking only for what this engine can do. Bad input is a ValueError (or TypeError) that names the
field, and nothing of the request is left behind."""

from __future__ import annotations

from minillm.sampling_params import SamplingParams

PromptType = str | dict


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, speculative: bool) -> None:
        """tokenizer: None where the engine takes token ids only (skip_tokenizer_init); speculative:
        whether the engine speculates (its steps do not score prompts)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.speculative = speculative

    def process_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Validate a prompt and tokenize it: a string, {"prompt": str} or {"prompt_token_ids": [...]}."""
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), prompt["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError(f"prompt_token_ids must be a list of ints, got {ids!r:.80}")
            ids = list(ids)
        else:
            text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
            if not isinstance(text, str):
                raise ValueError("prompt must be a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
                                 f"got {type(prompt).__name__}")
            try:
                text.encode()
            except UnicodeEncodeError as e:
                raise ValueError(f"prompt must be valid Unicode text: it holds a lone surrogate at {e.start}") from None
            if self.tokenizer is None:
                raise ValueError("prompt must be {'prompt_token_ids': [...]} when skip_tokenizer_init=True")
            ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        if not ids:
            raise ValueError("prompt must not be empty (it has no tokens)")
        vocab = self.vocab_size
        if bad := [i for i in ids if not 0 <= i < vocab]:
            raise ValueError(f"prompt_token_ids must be in [0, {vocab}), got {bad[0]}")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, but max_model_len is {self.max_model_len}: "
                             "it must be shorter, to leave room for at least one generated token")
        return text, ids

    def check_params(self, params: SamplingParams) -> None:
        """Every field bounded (SamplingParams.verify, run again: a field may have been set since), and
        nothing asked for that this engine cannot do."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        params.verify()
        if params.stop_strings and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; with skip_tokenizer_init=True use stop_token_ids")
        for name in ("logprobs", "prompt_logprobs"):
            if (value := getattr(params, name)) is not None and value > self.vocab_size:
                raise ValueError(f"{name} must be <= vocab_size={self.vocab_size}, got {value}")
        if params.prompt_logprobs is not None and self.speculative:
            # The model runner's speculative steps do not score prompts.
            raise ValueError("prompt_logprobs is not supported with speculative decoding (speculative_config); "
                             "leave one out")
