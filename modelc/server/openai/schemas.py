"""OpenAI's request and response bodies: chat completions, completions, embeddings, models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from modelc.server.schemas import (
    EmbedInput,
    MaxTokens,
    Messages,
    Name,
    NChoices,
    Prose,
    Req,
    Resp,
    Sampling,
    Text,
    TokenId,
    Tool,
    ToolCallOut,
    ToolChoice,
    TopLogprobs,
)


class JsonSchemaSpec(Req):
    name: Annotated[str, Meta(max_length=64)] = "response"
    schema: dict[str, Any] | None = None
    description: Text | None = None
    strict: bool | None = None


class ResponseFormat(Req):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StreamOptions(Req):
    include_usage: bool = False


class OpenAIGeneration(Sampling, kw_only=True):
    """Fields shared by ``/v1/chat/completions`` and ``/v1/completions``."""

    model: Name | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: NChoices = 1
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    response_format: ResponseFormat | None = None
    user: Name | None = None
    ignore_eos: bool = False

    @property
    def token_limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens`` (None: to the end of the turn)."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(OpenAIGeneration, kw_only=True):
    messages: Messages
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: Name | None = None
    return_token_ids: bool = False  # vLLM: prompt_token_ids and each choice's token_ids
    return_progress: bool = False  # llama.cpp: prompt_progress chunks while streaming
    # the thinking trace: llama-server's reasoning_format (none: left in content), the
    # template's variables (enable_thinking...), gpt-oss's reasoning_effort
    reasoning_format: Literal["auto", "deepseek", "deepseek-legacy", "none"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    grammar: Text | None = None  # llama.cpp: GBNF over the raw output (tools still parsed)
    # llama.cpp's reasoning budget: tokens of trace before its end is forced (-1: the
    # server's --reasoning-budget), and a message written before the end tag
    reasoning_budget_tokens: Annotated[int, Meta(ge=-1)] | None = None
    thinking_budget_tokens: Annotated[int, Meta(ge=-1)] | None = None  # (its other name)
    reasoning_budget_message: Text | None = None


class ChatMessageOut(Resp, omit_defaults=True):
    role: str
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    reasoning_content: str | None = None


class TopLogprob(Resp):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(Resp):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Resp):
    content: list[TokenLogprob] | None


class ChatChoice(Resp):
    index: int
    message: ChatMessageOut
    finish_reason: str
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None


class PromptTokensDetails(Resp):
    cached_tokens: int = 0


class Usage(Resp):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ChatCompletion(Resp):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None


class ToolCallDelta(Resp, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None
    function: dict[str, str] | None = None


class ChatDelta(Resp, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None


class ChatChunkChoice(Resp):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class PromptProgress(Resp):
    """llama.cpp's ``prompt_progress``: prompt tokens in total, from the cache, processed."""

    total: int
    cache: int
    processed: int
    time_ms: float


class ChatProgressChunk(Resp):
    """A streamed chunk with no choice delta, carrying prompt-processing progress."""

    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    prompt_progress: PromptProgress
    object: str = "chat.completion.chunk"


class ChatCompletionChunk(Resp):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    usage: Usage | None = None
    system_fingerprint: str | None = None


PromptItem = Prose | TokenId | Annotated[list[TokenId], Meta(min_length=1, max_length=1_000_000)]


Prompt = Prose | Annotated[list[PromptItem], Meta(min_length=1, max_length=1_000_000)]


class CompletionRequest(OpenAIGeneration, kw_only=True):
    prompt: Prompt
    best_of: NChoices | None = None
    echo: bool = False
    suffix: Text | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    return_token_ids: bool = False  # vLLM: prompt_token_ids and token_ids in each choice


class CompletionLogprobs(Resp):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Resp):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class Completion(Resp):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    object: str = "text_completion"
    system_fingerprint: str | None = None


class EmbeddingRequest(Req):
    input: EmbedInput
    model: Name | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1, le=65536)] | None = None
    user: Name | None = None


class EmbeddingData(Resp):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(Resp):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Resp):
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


class ModelCard(Resp):
    id: str
    created: int
    owned_by: str
    root: str
    object: str = "model"
    max_model_len: int | None = None


class ModelList(Resp):
    data: list[ModelCard]
    object: str = "list"
