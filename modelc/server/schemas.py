"""The bodies every dialect shares: limits declared once, request/response bases, the
error object, sampling fields, chat messages and tools.

Each API dialect keeps its own bodies beside its routes (``openai/schemas.py``,
``ollama/schemas.py``, ``llamacpp/schemas.py``, ``native/schemas.py``,
``anthropic/schemas.py``, ``responses/schemas.py``) built from these.  Request Structs
reject wrong types and out-of-range values at decode time (the server turns a
:class:`msgspec.ValidationError` into a 400 naming the field); fields that clients
commonly send but that do not change the result (``user``, ``store``, ``metadata`` ...)
are accepted and ignored.  A decoder is built once per request type, in :data:`DECODERS`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from modelc.errors import UsageError
from modelc.runtime.samplers import chain_settings
from modelc.runtime.sampling import FURTHER_SAMPLERS

Text = Annotated[str, Meta(max_length=1_000_000)]


Prose = Annotated[str, Meta(min_length=1, max_length=1_000_000)]  # text that must say something


ShortText = Annotated[str, Meta(max_length=256)]


Name = Annotated[str, Meta(max_length=256)]


TokenId = Annotated[int, Meta(ge=0, le=(1 << 31) - 1)]


Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]


TopP = Annotated[float, Meta(gt=0.0, le=1.0)]


MinP = Annotated[float, Meta(ge=0.0, le=1.0)]


Unit = Annotated[float, Meta(ge=0.0, le=1.0)]  # a probability or threshold (XTC's)


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


ROLES = ("system", "user", "assistant", "tool", "developer", "function")


Role = Literal["system", "user", "assistant", "tool", "developer", "function"]


class Req(Struct, kw_only=True, omit_defaults=True):
    """Base of request bodies."""


class Resp(Struct, kw_only=True):
    """Base of response bodies."""


class ErrorDetail(Resp):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Resp):
    error: ErrorDetail


# llama.cpp's further sampler fields: the numbers SamplingParams takes, then those read here
FURTHER_FIELDS = (
    *FURTHER_SAMPLERS,
    "dry_sequence_breakers",
    "samplers",
    "dynatemp_range",
    "adaptive_target",
)


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
    # llama.cpp's further samplers (its names and limits; None: off)
    typical_p: TopP | None = None
    top_n_sigma: Annotated[float, Meta(le=100.0)] | None = None  # <= 0: off
    xtc_probability: Unit | None = None
    xtc_threshold: Unit | None = None  # > 0.5: off
    mirostat: Annotated[int, Meta(ge=0, le=2)] | None = None
    mirostat_tau: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    mirostat_eta: Annotated[float, Meta(ge=0.0, le=10.0)] | None = None
    dry_multiplier: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    dry_base: Annotated[float, Meta(ge=1.0, le=100.0)] | None = None
    dry_allowed_length: Annotated[int, Meta(ge=0, le=1_048_576)] | None = None
    dry_penalty_last_n: Annotated[int, Meta(ge=-1, le=1_048_576)] | None = None  # -1: all
    dry_sequence_breakers: Annotated[list[ShortText], Meta(min_length=1, max_length=64)] | None = (
        None
    )
    # llama.cpp's own order, some samplers left out (names, or its letters: "edskypmxt")
    samplers: Annotated[list[ShortText], Meta(max_length=16)] | ShortText | None = None
    # llama.cpp samplers modelc does not have: a 400 unless off
    dynatemp_range: float | None = None  # 0: off
    adaptive_target: float | None = None  # negative: off
    # modelc's own: false = no speculative decoding for this request (default: the
    # server's --speculate; auto drafts only where it pays)
    speculative: bool | None = None

    def further(self) -> dict[str, Any]:
        """llama.cpp's further samplers as given (for a dialect's :class:`Sampling`)."""
        return {f: getattr(self, f) for f in FURTHER_FIELDS}

    def values(self) -> dict[str, float | int | None]:
        """The fields :meth:`~modelc.runtime.prompt.SamplingDefaults.params` settles
        over the model's defaults, by its names (None: the default).  Raises UsageError
        naming a sampler modelc does not have, if the request turns one on."""
        if self.dynatemp_range:
            raise UsageError(
                "dynatemp_range: dynamic temperature is not supported; leave it 0",
                param="dynatemp_range",
            )
        if self.adaptive_target is not None and self.adaptive_target >= 0:
            raise UsageError(
                "adaptive_target: the adaptive-p sampler is not supported; leave it negative",
                param="adaptive_target",
            )
        off = {} if self.samplers is None or self.mirostat else chain_settings(self.samplers)
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "repeat_last_n": self.repeat_last_n,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            **{f: getattr(self, f) for f in FURTHER_SAMPLERS},  # the numbers
            **off,
        }


class ImageURL(Req):
    url: Annotated[str, Meta(max_length=8 << 20)]  # a data: URL (the body's limit)
    detail: ShortText | None = None  # accepted, ignored (one size per model)


class ContentPart(Req):
    type: Literal["text", "image_url"]  # images: with a vision part (--mmproj)
    text: Text | None = None
    image_url: ImageURL | None = None


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


class ToolCallOut(Resp):
    id: str
    function: FunctionCall
    type: str = "function"


EmbedInput = (
    Prose
    | Annotated[
        list[Prose | TokenId | Annotated[list[TokenId], Meta(min_length=1, max_length=100_000)]],
        Meta(min_length=1, max_length=2048),
    ]
)


class _Decoders(dict[type[Any], msgspec.json.Decoder[Any]]):
    """A JSON decoder per request type, built on first use."""

    def __missing__(self, kind: type[Any]) -> msgspec.json.Decoder[Any]:
        dec: msgspec.json.Decoder[Any] = msgspec.json.Decoder(kind)
        self[kind] = dec
        return dec


DECODERS = _Decoders()
ENCODER = msgspec.json.Encoder()
