"""The request bodies the server accepts: OpenAI's fields, and vLLM's extras (top_k, min_p,
ignore_eos, ...) beside them. Fields the engine does not implement are refused by name rather than
silently ignored; fields that change nothing here (user, ...) are ignored, as OpenAI's server does."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from minillm.sampling_params import MAX_INT32, MAX_LOGPROBS, MAX_SEED, MIN_SEED, RequestOutputKind, SamplingParams

MAX_N = 128  # choices per request, as OpenAI caps it; each is a request in the engine
# OpenAI's and vLLM's fields that minillm does not implement, each with the values that ask for
# nothing (absent and null always do): any other value is refused by name, never silently ignored.
UNSUPPORTED: dict[str, tuple] = {
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "response_format": ({"type": "text"},), "logit_bias": ({},), "suffix": ("",), "best_of": (1,),
    "prompt_logprobs": (), "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
}


# Strict types, as the schema states them: "3" is not a number, and false is not a token id (an int
# is still taken where a float is asked for, as JSON writes 1 for 1.0).
STRICT = ConfigDict(strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingRequest(BaseModel):
    """What completions and chat share. Fields not named here are kept aside (`model_extra`): those
    of UNSUPPORTED are refused, the rest (user, metadata, ...) change nothing and are ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's extras
    repetition_penalty: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def sampling_params(self, max_tokens: int | None, logprobs: int | None, index: int) -> SamplingParams:
        """The engine's parameters for choice `index`; SamplingParams raises ValueError naming the field
        and its range, which the server answers with a 400."""
        if self.seed is not None and MIN_SEED <= self.seed <= MAX_SEED < self.seed + self.n - 1:
            raise ValueError(f"seed must be in [{MIN_SEED}, {MAX_SEED - self.n + 1}] with n={self.n}: "
                             "choice j samples with seed + j")
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            # Each of n choices is its own request: with a seed, each gets its own, as in vLLM.
            seed=None if self.seed is None else self.seed + index,
            max_tokens=max_tokens, min_tokens=self.min_tokens, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, logprobs=logprobs, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            output_kind=RequestOutputKind.CUMULATIVE if self.stream else RequestOutputKind.FINAL_ONLY)

    def refuse_unsupported(self) -> None:
        """ValueError naming the first field asking for what minillm does not implement."""
        for name, value in (self.model_extra or {}).items():
            neutral = UNSUPPORTED.get(name)
            if neutral is not None and value is not None and value not in neutral and not (
                    name == "best_of" and value == self.n):
                raise ValueError(f"{name} is not supported by minillm (got {value!r:.60}); leave it out")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # 0 only with echo: the prompt alone, scored
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo and self.stream:
            raise ValueError("echo is not supported with stream: true by minillm; leave one out")

    def prompts(self) -> list[dict]:
        """The engine's prompts: text, or token ids (one list or several)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [{"prompt": prompt}]
        if not prompt:
            raise ValueError("prompt must not be empty")
        if isinstance(prompt[0], int):
            return [{"prompt_token_ids": prompt}]
        return [{"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p} for p in prompt]


class ChatCompletionRequest(SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = None  # until the context is full, as OpenAI's chat
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT32)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True

    def conversation(self) -> list[dict[str, str]]:
        """The messages with their content as text: a list of parts is joined, as most templates expect."""
        out = []
        for i, message in enumerate(self.messages):
            role, content = message.get("role"), message.get("content")
            if not isinstance(role, str):
                raise ValueError(f"messages[{i}].role must be a string, got {role!r:.40}")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            if not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
            out.append({**message, "role": role, "content": content})
        return out

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")

    def max_new_tokens(self) -> int | None:
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(BaseModel):
    """vLLM's POST /tokenize: a prompt, or chat messages rendered by the chat template."""

    model_config = STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    tokens: list[int]


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowedError",
               413: "RequestTooLargeError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_body(status: int, message: str) -> dict:
    """OpenAI's error shape, which its clients read the message from."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": None, "code": status}}
