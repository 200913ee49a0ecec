"""Ollama's bodies (its ``/api/`` routes): generate, chat, embed, and the model-store routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from modelc.server.schemas import (
    MinP,
    Name,
    Penalty,
    Prose,
    RepPenalty,
    Req,
    Resp,
    Role,
    Sampling,
    Seed,
    StopList,
    Temperature,
    Text,
    Tool,
    TopK,
    TopP,
)

# Ollama's keep_alive: seconds (negative: forever) or a duration such as "5m" or "1h30m"
KeepAlive = Annotated[str, Meta(max_length=32)] | int | float | None


class OllamaError(Resp):
    """Ollama's error body (its ``/api/`` routes)."""

    error: str


class OllamaOptions(Req):
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    num_predict: Annotated[int, Meta(ge=-2, le=1_048_576)] | None = None
    repeat_penalty: RepPenalty | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: StopList | None = None
    num_ctx: Annotated[int, Meta(ge=1, le=1_048_576)] | None = None
    repeat_last_n: Annotated[int, Meta(ge=-1, le=1_048_576)] | None = None  # -1: num_ctx
    typical_p: TopP | None = None
    mirostat: Annotated[int, Meta(ge=0, le=2)] | None = None
    mirostat_tau: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    mirostat_eta: Annotated[float, Meta(ge=0.0, le=10.0)] | None = None

    def sampling(self) -> Sampling:
        """These options as the sampling fields every dialect shares."""
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repeat_penalty,
            repeat_last_n=(
                self.repeat_last_n
                if self.repeat_last_n is None or self.repeat_last_n >= 0
                else (self.num_ctx or 1_048_576)
            ),
            typical_p=self.typical_p,
            mirostat=self.mirostat,
            mirostat_tau=self.mirostat_tau,
            mirostat_eta=self.mirostat_eta,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            stop=list(self.stop or []),
        )


class OllamaGeneration(Req):
    """Fields shared by ``/api/generate`` and ``/api/chat``."""

    model: Name
    stream: bool = True
    format: Literal["json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None
    think: bool | Literal["low", "medium", "high"] | None = None  # the trace -> thinking


Images = Annotated[list[Annotated[str, Meta(max_length=8 << 20)]], Meta(max_length=16)]  # base64


class OllamaGenerateRequest(OllamaGeneration, kw_only=True):
    prompt: Text = ""
    system: Text | None = None
    raw: bool = False
    images: Images | None = None


class OllamaMessageIn(Req):
    role: Role
    content: Text = ""
    tool_calls: list[dict[str, Any]] | None = None
    thinking: Text | None = None
    images: Images | None = None


class OllamaChatRequest(OllamaGeneration, kw_only=True):
    messages: Annotated[list[OllamaMessageIn], Meta(max_length=2048)]
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None


class OllamaGenerateChunk(Resp, omit_defaults=True):
    model: str
    created_at: str
    response: str
    done: bool
    done_reason: str | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    total_duration: int | None = None
    context: list[int] | None = None  # prompt + response token ids (final chunk)
    thinking: str | None = None


class OllamaFunctionCall(Resp):
    name: str
    arguments: dict[str, Any]


class OllamaToolCall(Resp):
    function: OllamaFunctionCall


class OllamaMessage(Resp, omit_defaults=True):
    role: str
    content: str
    tool_calls: list[OllamaToolCall] | None = None
    thinking: str | None = None


class OllamaChatChunk(Resp, omit_defaults=True):
    model: str
    created_at: str
    message: OllamaMessage
    done: bool
    done_reason: str | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None
    total_duration: int | None = None


class OllamaEmbedRequest(Req):
    model: Name
    input: Prose | Annotated[list[Prose], Meta(min_length=1, max_length=2048)]
    truncate: bool = True
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None


class OllamaEmbedResponse(Resp):
    model: str
    embeddings: list[list[float]]
    prompt_eval_count: int


class OllamaModelDetails(Resp):
    parent_model: str
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class OllamaModel(Resp):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaModelDetails


class OllamaTags(Resp):
    models: list[OllamaModel]


class OllamaRunning(Resp):
    name: str
    model: str
    size: int
    digest: str
    details: OllamaModelDetails
    expires_at: str
    size_vram: int
    context_length: int


class OllamaRunningList(Resp):
    models: list[OllamaRunning]


class OllamaShowRequest(Req):
    model: Name | None = None
    name: Name | None = None  # older clients
    verbose: bool = False


class OllamaShowResponse(Resp):
    modelfile: str
    parameters: str  # Modelfile PARAMETER lines: the sampling defaults in effect
    template: str
    details: OllamaModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str
    system: str = ""
    license: str = ""
    # the conversation every chat starts with (/api/create's messages)
    messages: list[OllamaMessage] = msgspec.field(default_factory=list)


class OllamaStatus(Resp):
    status: str


class OllamaPullProgress(Resp):
    """One file's progress line of a streamed ``/api/pull``."""

    status: str
    digest: str
    total: int
    completed: int


class OllamaPullRequest(Req):
    model: Name | None = None
    name: Name | None = None
    insecure: bool = False
    stream: bool = True


class OllamaCopyRequest(Req):
    source: Name
    destination: Name


class OllamaDeleteRequest(Req):
    model: Name | None = None
    name: Name | None = None


Parameter = float | int | str | bool | Annotated[list[float | int | str], Meta(max_length=64)]


# a blob's name: ``sha256:`` and 64 hex digits (``/api/blobs/:digest``, ``files``)
Digest = Annotated[str, Meta(pattern=r"^sha256[:-][0-9a-fA-F]{64}$")]
FileName = Annotated[str, Meta(min_length=1, max_length=512)]
Files = Annotated[dict[FileName, Digest], Meta(max_length=4096)]


class OllamaCreateRequest(Req):
    model: Name | None = None
    name: Name | None = None
    from_: Name | None = msgspec.field(default=None, name="from")
    files: Files | None = None  # file name -> blob: a GGUF, or a Hugging Face directory's files
    adapters: Files | None = None  # a PEFT LoRA: adapter_config.json + its .safetensors
    modelfile: Text | None = None  # older clients: FROM / PARAMETER / TEMPLATE / SYSTEM lines
    template: Text | None = None
    system: Text | None = None
    parameters: Annotated[dict[str, Parameter], Meta(max_length=64)] | None = None
    messages: Annotated[list[OllamaMessageIn], Meta(max_length=256)] | None = None
    license: Text | list[Text] | None = None
    quantize: Annotated[str, Meta(max_length=16)] | None = None  # q4_K_M, q8_0, ...
    stream: bool = True


class OllamaEmbeddingsRequest(Req):
    """The older single-text ``/api/embeddings``."""

    model: Name
    prompt: Text = ""
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None


class OllamaEmbeddingsResponse(Resp):
    embedding: list[float]
