"""Every request and response body, as msgspec Structs with their limits declared once.

Request Structs reject wrong types and out-of-range values at decode time (the
server turns a :class:`msgspec.ValidationError` into a 400 naming the field); fields
that clients commonly send but that do not change the result (``user``,
``store``, ``metadata`` ...) are accepted and ignored.
Decoders are built once, in :data:`DECODERS`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

# --- shared limits -----------------------------------------------------------------------
Text = Annotated[str, Meta(max_length=1_000_000)]
Prose = Annotated[str, Meta(min_length=1, max_length=1_000_000)]  # text that must say something
ShortText = Annotated[str, Meta(max_length=256)]
Name = Annotated[str, Meta(max_length=256)]
TokenId = Annotated[int, Meta(ge=0, le=(1 << 31) - 1)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
MinP = Annotated[float, Meta(ge=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=0, le=1_000_000)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepPenalty = Annotated[float, Meta(gt=0.0, le=10.0)]
MaxTokens = Annotated[int, Meta(ge=0, le=1_048_576)]
NChoices = Annotated[int, Meta(ge=1, le=16)]
Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
Bias = Annotated[float, Meta(ge=-100.0, le=100.0)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]
StopList = Annotated[list[ShortText], Meta(max_length=16)]
Stop = ShortText | StopList | None
LogitBias = Annotated[
    dict[Annotated[str, Meta(pattern=r"^[0-9]{1,10}$")], Bias], Meta(max_length=1024)
]  # token id (as a string, OpenAI's form) -> bias

# Ollama's keep_alive: seconds (negative: forever) or a duration such as "5m" or "1h30m"
KeepAlive = Annotated[str, Meta(max_length=32)] | int | float | None

ROLES = ("system", "user", "assistant", "tool", "developer", "function")
Role = Literal["system", "user", "assistant", "tool", "developer", "function"]


class Req(Struct, kw_only=True, omit_defaults=True):
    """Base of request bodies."""


class Resp(Struct, kw_only=True):
    """Base of response bodies."""


# --- errors ------------------------------------------------------------------------------
class ErrorDetail(Resp):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OllamaError(Resp):
    """Ollama's error body (its ``/api/`` routes)."""

    error: str


class ErrorResponse(Resp):
    error: ErrorDetail


# --- sampling ----------------------------------------------------------------------------
class Sampling(Req):
    """Sampling fields of every generation request; None: the model's default (see
    :class:`~modelc.runtime.prompt.SamplingDefaults`)."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepPenalty | None = None
    repeat_last_n: Annotated[int, Meta(ge=0, le=1_048_576)] | None = None
    logit_bias: LogitBias | None = None
    stop: Stop = None
    seed: Seed | None = None
    # modelc's own: false = no speculative decoding for this request (default: the
    # server's --speculate; auto drafts only where it pays)
    speculative: bool | None = None


# --- chat --------------------------------------------------------------------------------
class ContentPart(Req):
    type: Literal["text"]  # images are not supported yet
    text: Text | None = None


class FunctionCall(Req):
    name: Name
    arguments: Text = "{}"


class ToolCall(Req):
    function: FunctionCall
    id: Name | None = None
    type: Literal["function"] = "function"
    index: int | None = None


class ChatMessage(Req):
    role: Role
    content: Text | Annotated[list[ContentPart], Meta(max_length=256)] | None = None
    name: Name | None = None
    tool_calls: Annotated[list[ToolCall], Meta(max_length=64)] | None = None
    tool_call_id: Name | None = None
    reasoning_content: Text | None = None  # an earlier turn's trace, for the template


Messages = Annotated[list[ChatMessage], Meta(min_length=1, max_length=2048)]


class FunctionDef(Req):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Req):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Req):
    name: Name


class NamedToolChoice(Req):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


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


class ToolCallOut(Resp):
    id: str
    function: FunctionCall
    type: str = "function"


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


# --- completions -------------------------------------------------------------------------
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


# --- embeddings --------------------------------------------------------------------------
EmbedInput = (
    Prose
    | Annotated[
        list[Prose | TokenId | Annotated[list[TokenId], Meta(min_length=1, max_length=100_000)]],
        Meta(min_length=1, max_length=2048),
    ]
)


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


# --- models ------------------------------------------------------------------------------
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


# --- native ------------------------------------------------------------------------------
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


class LlamaEmbeddingRequest(Req):
    """llama.cpp's ``/embedding``: ``content`` (or ``input``); ``embd_normalize`` -1 none,
    0 max-abs scaled to the int16 range, 1 taxicab, 2 euclidean (its default), > 2 p-norm."""

    content: EmbedInput | None = None
    input: EmbedInput | None = None
    embd_normalize: int = 2
    model: Name | None = None


class LlamaEmbedding(Resp):
    index: int
    embedding: list[list[float]]  # one row: the pooled vector (llama.cpp: one per token unpooled)


class NativeEmbeddingResponse(Resp):
    embeddings: list[list[float]]
    model: str
    prompt_tokens: int


class TokenizeRequest(Req):
    content: Text | None = None  # llama.cpp
    prompt: Text | None = None  # vLLM
    messages: Messages | None = None  # vLLM chat form
    add_special: bool | None = None  # llama.cpp (default false)
    add_special_tokens: bool | None = None  # vLLM (default true)
    parse_special: bool = True  # llama.cpp: control-token texts become their ids
    add_generation_prompt: bool = True
    with_pieces: bool = False
    model: Name | None = None


# a string; ids and strings making one prompt; or several prompts (strings or such lists)
LlamaPromptItem = (
    Prose | TokenId | Annotated[list[Prose | TokenId], Meta(min_length=1, max_length=1_000_000)]
)
LlamaPrompt = Prose | Annotated[list[LlamaPromptItem], Meta(min_length=1, max_length=1_000_000)]
LlamaBias = (
    dict[str, Bias | bool]
    | Annotated[list[list[TokenId | Text | Bias | bool]], Meta(max_length=1024)]
)


class LlamaCompletionRequest(Sampling, kw_only=True):
    """llama.cpp's ``/completion`` (and ``/infill``): its field names and defaults."""

    prompt: LlamaPrompt
    n_predict: Annotated[int, Meta(ge=-2, le=1_048_576)] | None = None
    n_probs: Annotated[int, Meta(ge=0, le=20)] = 0
    stream: bool = False
    repeat_penalty: RepPenalty | None = None
    ignore_eos: bool = False
    return_tokens: bool = False
    cache_prompt: bool = True  # the prefix cache is always on
    id_slot: int = -1  # accepted; the engine places requests itself
    slot_id: int | None = None  # older name of id_slot
    logit_bias: LlamaBias | None = None  # type: ignore[assignment]
    json_schema: dict[str, Any] | None = None
    grammar: Text | None = None
    model: Name | None = None


class LlamaInfillRequest(LlamaCompletionRequest, kw_only=True):
    """``/infill``: the text before and after the hole (``prompt``: text after the hole's
    start, optional)."""

    prompt: Text | Annotated[list[LlamaPromptItem], Meta(max_length=1_000_000)] = ""  # type: ignore[assignment]
    input_prefix: Text = ""
    input_suffix: Text = ""


class LlamaTimings(Resp):
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    cache_n: int = 0


class LlamaTopProb(Resp):
    id: int
    token: str
    bytes: list[int]
    logprob: float


class LlamaTokenProb(Resp):
    id: int
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[LlamaTopProb]


class LlamaStreamChunk(Resp, omit_defaults=True):
    index: int
    content: str
    tokens: list[int]
    stop: bool
    id_slot: int
    tokens_predicted: int
    tokens_evaluated: int
    completion_probabilities: list[LlamaTokenProb] | None = None


class LlamaCompletion(Resp, omit_defaults=True):
    index: int
    content: str
    tokens: list[int]
    id_slot: int
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: dict[str, Any]
    prompt: str
    has_new_line: bool
    truncated: bool
    stop_type: str  # "eos" | "word" | "limit"
    stopping_word: str
    tokens_cached: int
    timings: LlamaTimings
    completion_probabilities: list[LlamaTokenProb] | None = None


class LlamaSlot(Resp):
    id: int
    n_ctx: int
    speculative: bool
    is_processing: bool


class ApplyTemplateRequest(Req):
    messages: Messages
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    add_generation_prompt: bool = True
    model: Name | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None


class ApplyTemplateResponse(Resp):
    prompt: str


class TokenPiece(Resp):
    id: int
    piece: str | list[int]  # the text, or its bytes when they are not valid UTF-8 (llama.cpp)


class LlamaTokenizeResponse(Resp):
    tokens: list[int | TokenPiece]


class TokenizeResponse(Resp):
    tokens: list[int | TokenPiece]
    count: int
    max_model_len: int


class DetokenizeRequest(Req):
    tokens: Annotated[list[TokenId], Meta(max_length=1_000_000)]
    model: Name | None = None


class DetokenizeResponse(Resp):
    content: str  # llama.cpp
    prompt: str  # vLLM


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


class SamplingSettings(Resp):
    """The defaults in effect (llama.cpp's ``params`` names, plus OpenAI's where they differ)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    max_tokens: int  # the cap for a request without max_tokens (it stops at end of turn)
    n_predict: int
    sources: dict[str, str]  # setting -> "model" | "config" | "llama-server"


class GenerationSettings(Resp):
    n_ctx: int
    params: SamplingSettings


class PropsResponse(Resp):
    model_path: str
    model: str
    model_alias: str
    architecture: str
    total_slots: int
    chat_template: str
    bos_token: str
    eos_token: str
    default_generation_settings: GenerationSettings
    build_info: str


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


# --- Ollama ------------------------------------------------------------------------------
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


class OllamaGeneration(Req):
    """Fields shared by ``/api/generate`` and ``/api/chat``."""

    model: Name
    stream: bool = True
    format: Literal["json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None
    think: bool | Literal["low", "medium", "high"] | None = None  # the trace -> thinking


class OllamaGenerateRequest(OllamaGeneration, kw_only=True):
    prompt: Text = ""
    system: Text | None = None
    raw: bool = False


class OllamaMessageIn(Req):
    role: Role
    content: Text = ""
    tool_calls: list[dict[str, Any]] | None = None
    thinking: Text | None = None


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


class OllamaStatus(Resp):
    status: str


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


class OllamaCreateRequest(Req):
    model: Name | None = None
    name: Name | None = None
    from_: Name | None = msgspec.field(default=None, name="from")
    modelfile: Text | None = None  # older clients: FROM / PARAMETER / TEMPLATE / SYSTEM lines
    template: Text | None = None
    system: Text | None = None
    parameters: Annotated[dict[str, Parameter], Meta(max_length=64)] | None = None
    license: Text | list[Text] | None = None
    stream: bool = True


class OllamaEmbeddingsRequest(Req):
    """The older single-text ``/api/embeddings``."""

    model: Name
    prompt: Text = ""
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None


class OllamaEmbeddingsResponse(Resp):
    embedding: list[float]


REQUEST_TYPES: tuple[type[Req], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    NativeCompleteRequest,
    NativeChatRequest,
    InferRequest,
    NativeEmbeddingRequest,
    LlamaEmbeddingRequest,
    TokenizeRequest,
    DetokenizeRequest,
    ApplyTemplateRequest,
    LlamaCompletionRequest,
    LlamaInfillRequest,
    OllamaShowRequest,
    OllamaPullRequest,
    OllamaCopyRequest,
    OllamaDeleteRequest,
    OllamaCreateRequest,
    OllamaEmbeddingsRequest,
    LoraLoadRequest,
    LoraUnloadRequest,
    OllamaGenerateRequest,
    OllamaChatRequest,
    OllamaEmbedRequest,
)

DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {
    t: msgspec.json.Decoder(t) for t in REQUEST_TYPES
}
ENCODER = msgspec.json.Encoder()
