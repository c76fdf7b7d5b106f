"""The request bodies the server accepts: OpenAI's fields, and vLLM's extras (top_k, min_p,
ignore_eos, ...) beside them. Fields the engine does not implement are refused by name rather than
silently ignored; fields that change nothing here (user, ...) are ignored, as OpenAI's server does.

Each field is typed and bounded here as strictly as the server enforces it, so that the OpenAPI
schema FastAPI derives from these models says what the server takes: the ranges are
SamplingParams's own. What a schema cannot say is checked after it, with a 400 all the same: rules
between fields (min_tokens <= max_tokens, top_logprobs needs logprobs, seed + n), and the model's own
limits (token ids within its vocabulary, prompt plus max_tokens within its context)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from minillm.sampling_params import (
    FLOAT32_MAX,
    MAX_INT32,
    MAX_LOGPROBS,
    MAX_N,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MAX_SEED,
    MIN_REPETITION_PENALTY,
    MIN_SEED,
    RequestOutputKind,
    SamplingParams,
)

# OpenAI's and vLLM's fields that minillm does not implement, each with the values that ask for
# nothing (absent and null always do): any other value is refused by name, never silently ignored.
UNSUPPORTED: dict[str, tuple] = {
    "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "response_format": ({"type": "text"},), "logit_bias": ({},), "suffix": ("",), "best_of": (1,),
    "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
}


# Strict types, as the schema states them: "3" is not a number, and false is not a token id (an int
# is still taken where a float is asked for, as JSON writes 1 for 1.0).
STRICT = ConfigDict(strict=True)

TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]  # and below the model's vocabulary size, checked later
Count = Annotated[int, Field(ge=0, le=MAX_INT32)]
NonEmpty = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
# A text, several, a prompt's token ids, or several prompts' token ids.
Prompt = NonEmpty | Annotated[list[NonEmpty], Field(min_length=1)] | TokenIds \
    | Annotated[list[TokenIds], Field(min_length=1)]


def number(default: float, low: float, high: float, *, above_low: bool = False) -> Any:
    """A finite float in [low, high] ((low, high] with above_low), as SamplingParams bounds it."""
    low_bound = {"gt": low} if above_low else {"ge": low}
    return Field(default, **low_bound, le=high, allow_inf_nan=False)


def lone_surrogate(value: Any) -> tuple[str, str] | None:
    """The first string of a parsed JSON body that holds a lone surrogate (JSON's "\\ud800", which
    Python reads but no UTF-8 text holds): its field's path and what is wrong; None if there is none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            for key in reversed(list(item)):
                stack.append((f"{path}.{key}" if path else str(key), item[key]))
                stack.append((f"{path} (a key)" if path else "body (a key)", key))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", item[i]) for i in reversed(range(len(item))))
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                return path or "body", (f"is not valid Unicode text: it holds a lone surrogate "
                                        f"(U+{ord(item[e.start]):04X}) at character {e.start}; JSON's "
                                        "\\ud800-\\udfff escapes come in high-low pairs")
    return None


class Request(BaseModel):
    """A request body: strict types, and text that is text throughout, nested models included (a
    lone surrogate would fail the tokenizer, or the reply that quotes it back)."""

    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if (found := lone_surrogate(data)) is not None:
            path, problem = found
            raise PydanticCustomError("lone_surrogate", "{param} " + problem, {"param": path})
        return data


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False
    # vLLM's: with include_usage, every chunk also carries its choice's usage so far (guidellm asks for it).
    continuous_usage_stats: bool = False


class SamplingRequest(Request):
    """What completions and chat share. Fields not named here are kept aside (`model_extra`): those
    of UNSUPPORTED are refused, the rest (user, metadata, ...) change nothing and are ignored."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float = number(1.0, 0, FLOAT32_MAX)  # 0 is greedy
    top_p: float = number(1.0, 0, 1, above_low=True)
    # Choice j samples with seed + j, so SamplingParams bounds seed by n too.
    seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    stop: NonEmpty | list[NonEmpty] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = number(0.0, -MAX_PENALTY, MAX_PENALTY)
    frequency_penalty: float = number(0.0, -MAX_PENALTY, MAX_PENALTY)
    # vLLM's extras
    repetition_penalty: float = number(1.0, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
    top_k: int = Field(0, ge=-1, le=MAX_INT32)  # 0 or -1: every token
    min_p: float = number(0.0, 0, 1)
    min_tokens: Count = 0
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Each prompt token's logprob and this many alternatives, in the response (not when streamed).
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """The engine's parameters, for all n choices (engine/parallel_sampling.py: choice j samples with
        seed + j); SamplingParams raises ValueError naming the field and its range, which the server
        answers with a 400."""
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            seed=self.seed, max_tokens=max_tokens, min_tokens=self.min_tokens, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens, include_stop_str_in_output=self.include_stop_str_in_output,
            presence_penalty=self.presence_penalty, prompt_logprobs=self.num_prompt_logprobs(),
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            output_kind=RequestOutputKind.CUMULATIVE if self.stream else RequestOutputKind.FINAL_ONLY)

    def refuse_unsupported(self) -> None:
        """ValueError naming the first field asking for what minillm does not implement."""
        for name, value in (self.model_extra or {}).items():
            neutral = UNSUPPORTED.get(name)
            # Compared with their types: true == 1 and 1.0 == 1 in Python, not in the request's strict types.
            asks_nothing = any(type(value) is type(v) and value == v for v in neutral or ()) or (
                name == "best_of" and type(value) is int and value == self.n)
            if neutral is not None and value is not None and not asks_nothing:
                raise ValueError(f"{name} is not supported by minillm (got {value!r:.60}); leave it out")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs is not available with stream: true; leave one out")

    def num_prompt_logprobs(self) -> int | None:
        """The alternatives the engine scores each prompt token with; None: the prompt is not scored."""
        return self.prompt_logprobs

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: Count | None = 16  # 0 only with echo: the prompt alone, scored
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo and self.stream:
            raise ValueError("echo is not supported with stream: true by minillm; leave one out")

    def num_prompt_logprobs(self) -> int | None:
        """echo with logprobs scores the prompt too: with the most alternatives either asks for."""
        asked = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return max(asked, default=None)

    def prompts(self) -> list[dict]:
        """The engine's prompts: text, or token ids (one list or several)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [{"prompt": prompt}]
        if isinstance(prompt[0], int):
            return [{"prompt_token_ids": prompt}]
        return [{"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p} for p in prompt]


class TextPart(BaseModel):
    """A part of a message's content: text only (images and audio are refused, not dropped)."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message; fields beyond role and content (name, ...) go to the chat template as they are."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[TextPart]


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=MAX_INT32)  # None: until the context is full, as OpenAI's chat
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_INT32)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    # vLLM's: the last message (the assistant's, begun) is continued rather than a new one opened.
    continue_final_message: bool = False

    def conversation(self) -> list[dict[str, Any]]:
        """The messages with their content as text: a list of parts is joined, as most templates expect."""
        return [{**message.model_dump(), "content": message.content if isinstance(message.content, str)
                 else "".join(part.text for part in message.content)} for message in self.messages]

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")

    def max_new_tokens(self) -> int | None:
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(Request):
    """vLLM's POST /tokenize: a prompt, or chat messages rendered by the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(Request):
    model: str | None = None
    tokens: list[TokenId]
