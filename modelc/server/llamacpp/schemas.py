"""llama.cpp server's bodies: /completion, /infill, /tokenize, /detokenize, /embedding, /props."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from modelc.server.schemas import (
    Bias,
    EmbedInput,
    Messages,
    Name,
    Prose,
    RepPenalty,
    Req,
    Resp,
    Sampling,
    Text,
    TokenId,
    Tool,
)


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

    def sampling(self, logit_bias: dict[str, float] | None) -> Sampling:
        """The sampling fields every dialect shares, in llama.cpp's reading: its
        ``repeat_penalty`` name, a negative seed for none, ``logit_bias`` as token ids."""
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=(
                self.repeat_penalty if self.repeat_penalty is not None else self.repetition_penalty
            ),
            repeat_last_n=self.repeat_last_n,
            logit_bias=logit_bias,
            stop=self.stop,
            seed=None if self.seed is None or self.seed < 0 else self.seed,
            **self.further(),
        )


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
    modalities: dict[str, bool]  # llama.cpp's: vision, audio, video
