"""OpenAI Responses' bodies: ``/v1/responses`` and its stored responses.

Input items are one Struct with the fields of every item kind the route takes
(``message``, ``function_call``, ``function_call_output``, ``reasoning``), since a
message item may leave its ``type`` out; the route checks each kind's fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, field

from modelc.server.schemas import MaxTokens, Name, Req, Resp, Temperature, Text, TopP


class _Part(Req, tag_field="type"):
    """A content part of an input message, told apart by its ``type``."""


class InputText(_Part, tag="input_text", kw_only=True):
    text: Text


class InputImage(_Part, tag="input_image", kw_only=True):
    image_url: Annotated[str, Meta(max_length=8 << 20)] | None = None  # a data: URL
    file_id: Name | None = None  # refused: no files are kept
    detail: Name | None = None  # accepted, ignored


class OutputText(_Part, tag="output_text", kw_only=True):
    text: Text
    annotations: list[Any] | None = None


class Refusal(_Part, tag="refusal", kw_only=True):
    refusal: Text


class ReasoningText(_Part, tag="reasoning_text", kw_only=True):
    """A reasoning item's trace, sent back (it goes into the template again)."""

    text: Text


Part = InputText | InputImage | OutputText | Refusal | ReasoningText
Parts = Annotated[list[Part], Meta(max_length=256)]


class InputItem(Req):
    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: Text | Parts | None = None
    id: Name | None = None
    status: Name | None = None
    call_id: Name | None = None
    name: Name | None = None
    arguments: Text | None = None
    output: Text | Parts | None = None
    summary: list[Any] | None = None  # a reasoning item's summary (read when it has no content)
    encrypted_content: Text | None = None


class FunctionTool(Req):
    type: Literal["function"]
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    parameters: dict[str, Any] | None = None
    description: Text | None = None
    strict: bool | None = None


class FunctionChoice(Req):
    type: Literal["function"]
    name: Name


class TextFormat(Req):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: Annotated[str, Meta(max_length=64)] | None = None
    schema: dict[str, Any] | None = None
    description: Text | None = None
    strict: bool | None = None


class TextConfig(Req):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class Reasoning(Req):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(Req, kw_only=True):
    model: Name | None = None
    input: Text | Annotated[list[InputItem], Meta(min_length=1, max_length=2048)]
    instructions: Text | None = None
    tools: Annotated[list[FunctionTool], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Meta(ge=1, le=1_048_576)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    text: TextConfig | None = None
    reasoning: Reasoning | None = None  # effort: the template's reasoning_effort (none: off)
    previous_response_id: Name | None = None  # a stored response this one continues
    store: bool | None = None  # keep this response (default: yes; in memory, bounded)
    background: bool | None = None
    metadata: (
        Annotated[dict[str, Annotated[str, Meta(max_length=512)]], Meta(max_length=16)] | None
    ) = None
    truncation: Literal["auto", "disabled"] | None = None
    user: Name | None = None
    include: list[Name] | None = None
    grammar: Text | None = None  # llama.cpp's: GBNF over the raw output (trace, calls parsed)
    service_tier: Name | None = None
    prompt_cache_key: Name | None = None
    safety_identifier: Name | None = None
    max_tool_calls: MaxTokens | None = None


# --- responses ---------------------------------------------------------------------------
class _ItemOut(Resp, tag_field="type"):
    pass


class OutputTextOut(Resp, tag_field="type", tag="output_text", kw_only=True):
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class ReasoningTextOut(Resp, tag_field="type", tag="reasoning_text", kw_only=True):
    text: str


class ReasoningOut(_ItemOut, tag="reasoning", kw_only=True):
    """The model's thinking trace (its text in ``content``; no summary is made)."""

    id: str
    status: str
    content: list[ReasoningTextOut]
    summary: list[Any] = field(default_factory=list)


class MessageOut(_ItemOut, tag="message", kw_only=True):
    id: str
    status: str
    content: list[OutputTextOut]
    role: str = "assistant"


class FunctionCallOut(_ItemOut, tag="function_call", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


OutputItem = ReasoningOut | MessageOut | FunctionCallOut
ContentPart = OutputTextOut | ReasoningTextOut


class InputTokensDetails(Resp):
    cached_tokens: int = 0


class OutputTokensDetails(Resp):
    reasoning_tokens: int = 0


class ResponsesUsage(Resp):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails


class IncompleteDetails(Resp):
    reason: str


class ResponseObject(Resp):
    id: str
    created_at: int
    status: str  # "in_progress" | "completed" | "incomplete"
    model: str
    output: list[OutputItem]
    usage: ResponsesUsage | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    tools: list[FunctionTool]
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice
    parallel_tool_calls: bool
    text: TextConfig
    reasoning: Reasoning | None = None
    previous_response_id: str | None = None
    error: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    store: bool = False
    truncation: str = "disabled"
    object: str = "response"


class Deleted(Resp):
    id: str
    object: str = "response"
    deleted: bool = True


# --- stream events (``event: <type>`` then ``data: <this>``) -----------------------------
class _Event(Resp, tag_field="type", kw_only=True):
    sequence_number: int


class Created(_Event, tag="response.created", kw_only=True):
    response: ResponseObject


class InProgress(_Event, tag="response.in_progress", kw_only=True):
    response: ResponseObject


class Completed(_Event, tag="response.completed", kw_only=True):
    response: ResponseObject


class Incomplete(_Event, tag="response.incomplete", kw_only=True):
    response: ResponseObject


class ItemAdded(_Event, tag="response.output_item.added", kw_only=True):
    output_index: int
    item: OutputItem


class ItemDone(_Event, tag="response.output_item.done", kw_only=True):
    output_index: int
    item: OutputItem


class PartAdded(_Event, tag="response.content_part.added", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class PartDone(_Event, tag="response.content_part.done", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    part: ContentPart


class TextDelta(_Event, tag="response.output_text.delta", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]


class TextDone(_Event, tag="response.output_text.done", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any]


class ReasoningDelta(_Event, tag="response.reasoning_text.delta", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningDone(_Event, tag="response.reasoning_text.done", kw_only=True):
    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDelta(_Event, tag="response.function_call_arguments.delta", kw_only=True):
    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(_Event, tag="response.function_call_arguments.done", kw_only=True):
    item_id: str
    output_index: int
    name: str
    arguments: str


StreamEvent = (
    Created
    | InProgress
    | Completed
    | Incomplete
    | ItemAdded
    | ItemDone
    | PartAdded
    | PartDone
    | TextDelta
    | TextDone
    | ReasoningDelta
    | ReasoningDone
    | ArgumentsDelta
    | ArgumentsDone
)
