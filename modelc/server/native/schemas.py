"""modelc's own bodies: /complete, /chat, /infer, /embeddings, health, info, LoRA."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from modelc.server.schemas import (
    EmbedInput,
    MaxTokens,
    Messages,
    Name,
    Prose,
    Req,
    Resp,
    Sampling,
)


class NativeOptions(Sampling, kw_only=True):
    max_tokens: MaxTokens | None = None
    model: Name | None = None  # default: the first model the server was started with


class NativeCompleteRequest(NativeOptions, kw_only=True):
    prompt: Prose


class NativeChatRequest(NativeOptions, kw_only=True):
    messages: Messages


class NativeUsage(Resp):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    time_to_first_token: float | None = None
    total_time: float = 0.0


class NativeCompleteResponse(Resp):
    text: str
    finish_reason: str
    usage: NativeUsage
    model: str


class NativeMessage(Resp):
    role: str
    content: str


class NativeChatResponse(Resp):
    message: NativeMessage
    finish_reason: str
    usage: NativeUsage
    model: str


class NativeStreamEvent(Resp, omit_defaults=True):
    delta: str = ""
    finish_reason: str | None = None
    usage: NativeUsage | None = None


class InferRequest(Req):
    inputs: Annotated[
        list[Annotated[list[float], Meta(max_length=1_000_000)]],
        Meta(min_length=1, max_length=4096),
    ]
    input_name: Name | None = None
    model: Name | None = None


class InferResponse(Resp):
    outputs: list[list[float]]
    model: str


class NativeEmbeddingRequest(Req):
    input: EmbedInput | None = None
    content: EmbedInput | None = None  # llama.cpp's field name
    model: Name | None = None


class NativeEmbeddingResponse(Resp):
    embeddings: list[list[float]]
    model: str
    prompt_tokens: int


class HealthResponse(Resp):
    status: str


class InfoResponse(Resp):
    model: str
    architecture: str
    path: str
    n_ctx: int
    n_vocab: int
    parameters: int
    file_size: int
    chat_template: bool
    capabilities: list[str]
    version: str


class VersionResponse(Resp):
    version: str
    git_sha: str


class SystemResponse(Resp):
    platform: str
    python: str
    cpu_count: int
    memory_total: int
    memory_available: int
    kernels: str


class LoraLoadRequest(Req):
    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    scale: Annotated[float, Meta(ge=-10.0, le=10.0)] = 1.0
    model: Name | None = None


class LoraUnloadRequest(Req):
    path: Annotated[str, Meta(max_length=4096)] | None = None
    model: Name | None = None


class LoraResponse(Resp):
    status: str
    adapters: list[str]
