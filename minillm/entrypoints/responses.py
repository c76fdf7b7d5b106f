"""The bodies of the server's 200 answers that are not streamed, as the OpenAPI schema documents them:
closed (no field beyond those named) and with every field the server always sends required, so
that a client generated from the schema, or a check of an answer against it, sees exactly what is
sent. The server builds its answers as plain dicts; tests/serving/test_openapi.py and
test_schemathesis.py hold what it sends against these. Names are vLLM's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length"]  # "abort" never reaches a whole response: the client left
StopReason = int | str | None  # the stop token id or stop string that ended a choice


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UsageInfo(Closed):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Logprob(Closed):
    """A token's logprob given what precedes it, its rank (1: the most likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str | None  # None when the server has no tokenizer


# vLLM's prompt_logprobs: null for the first prompt token, then per token {token id: Logprob}, the
# token itself and the most likely tokens there.
TokenIdKey = Annotated[str, Field(pattern=r"^[0-9]+$")]
PromptLogprobs = list[Annotated[dict[TokenIdKey, Logprob], Field(json_schema_extra={"additionalProperties": False})]
                      | None]


class CompletionLogProbs(Closed):
    """The legacy format: parallel lists, one entry per token (an echoed prompt's first token has none)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionResponseChoice(Closed):
    index: int
    text: str
    logprobs: CompletionLogProbs | None
    finish_reason: FinishReason
    stop_reason: StopReason
    prompt_logprobs: PromptLogprobs | None  # its prompt's, with prompt_logprobs in the request


class CompletionResponse(Closed):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class AssistantMessage(Closed):
    role: Literal["assistant"]
    content: str


class ChatCompletionLogProb(Closed):
    token: str
    logprob: float
    bytes: list[int]  # the token's text as UTF-8


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb]


class ChatCompletionLogProbs(Closed):
    content: list[ChatCompletionLogProbsContent]


class ChatCompletionResponseChoice(Closed):
    index: int
    message: AssistantMessage
    logprobs: ChatCompletionLogProbs | None
    finish_reason: FinishReason
    stop_reason: StopReason


class ChatCompletionResponse(Closed):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None  # the rendered prompt's, with prompt_logprobs in the request


class ModelCard(Closed):
    id: str  # the served name
    object: Literal["model"]
    created: int
    owned_by: str
    root: str  # the model it serves
    max_model_len: int


class ModelList(Closed):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(Closed):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(Closed):
    prompt: str


class VersionResponse(Closed):
    version: str
