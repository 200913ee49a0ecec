"""Anthropic Messages' bodies: ``/v1/messages`` and ``/v1/messages/count_tokens``.

Content blocks are tagged unions on ``type`` (msgspec refuses an unknown block type with a
400 naming it); a ``thinking`` block is accepted in input, an ``image`` block (base64)
goes to the model's vision part.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from modelc.server.schemas import Name, Req, Resp, ShortText, StopList, Text, TopK, TopP

AnthropicTemperature = Annotated[float, Meta(ge=0.0, le=1.0)]


class _Block(Req, tag_field="type"):
    """A content block, told apart by its ``type``."""


class TextBlock(_Block, tag="text", kw_only=True):
    text: Text
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None


class ImageSource(Req):
    type: Literal["base64", "url"]
    media_type: ShortText | None = None
    data: Annotated[str, Meta(max_length=8 << 20)] | None = None  # base64
    url: Annotated[str, Meta(max_length=8192)] | None = None  # refused: nothing is fetched


class ImageBlock(_Block, tag="image", kw_only=True):
    source: ImageSource
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(_Block, tag="tool_use", kw_only=True):
    id: Name
    name: Name
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Block, tag="tool_result", kw_only=True):
    tool_use_id: Name
    content: Text | Annotated[list[TextBlock], Meta(max_length=256)] = ""
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(_Block, tag="thinking", kw_only=True):
    thinking: Text
    signature: Annotated[str, Meta(max_length=1_000_000)] | None = None


class RedactedThinkingBlock(_Block, tag="redacted_thinking", kw_only=True):
    data: Annotated[str, Meta(max_length=1_000_000)]


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


class MessageParam(Req):
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[Block], Meta(max_length=1024)]


class AnthropicTool(Req):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    input_schema: dict[str, Any]
    description: Text | None = None
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class _Choice(Req, tag_field="type"):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAuto(_Choice, tag="auto", kw_only=True):
    pass


class ToolChoiceAny(_Choice, tag="any", kw_only=True):
    pass


class ToolChoiceTool(_Choice, tag="tool", kw_only=True):
    name: Name


class ToolChoiceNone(_Choice, tag="none", kw_only=True):
    pass


AnthropicToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone
System = Text | Annotated[list[TextBlock], Meta(max_length=256)]
Conversation = Annotated[list[MessageParam], Meta(min_length=1, max_length=2048)]


class Metadata(Req):
    user_id: Annotated[str, Meta(max_length=256)] | None = None


class CountTokensRequest(Req):
    """``/v1/messages/count_tokens``: the conversation a ``/v1/messages`` request would send."""

    model: Name
    messages: Conversation
    system: System | None = None
    tools: Annotated[list[AnthropicTool], Meta(max_length=128)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    # {"type": "enabled" | "disabled"}: the template's enable_thinking (unset: the template's)
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1, le=1_048_576)]
    stop_sequences: StopList | None = None
    stream: bool = False
    temperature: AnthropicTemperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    service_tier: Name | None = None
    grammar: Text | None = None  # llama.cpp's: GBNF over the raw output (trace, calls parsed)


# --- responses ---------------------------------------------------------------------------
class _BlockOut(Resp, tag_field="type"):
    pass


class ThinkingOut(_BlockOut, tag="thinking", kw_only=True):
    thinking: str
    signature: str = ""  # Anthropic's encrypted check; here the trace's digest


class TextOut(_BlockOut, tag="text", kw_only=True):
    text: str


class ToolUseOut(_BlockOut, tag="tool_use", kw_only=True):
    id: str
    name: str
    input: dict[str, Any]


BlockOut = ThinkingOut | TextOut | ToolUseOut


class AnthropicUsage(Resp):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(Resp):
    id: str
    model: str
    content: list[BlockOut]
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage
    type: str = "message"
    role: str = "assistant"


class AnthropicErrorDetail(Resp):
    type: str
    message: str


class AnthropicError(Resp):
    """Anthropic's error body (``/v1/messages`` routes)."""

    error: AnthropicErrorDetail
    type: str = "error"


class CountTokensResponse(Resp):
    input_tokens: int


# --- stream events (``event: <type>`` then ``data: <this>``) -----------------------------
class _Event(Resp, tag_field="type"):
    pass


class MessageStart(_Event, tag="message_start", kw_only=True):
    message: Message


class BlockStart(_Event, tag="content_block_start", kw_only=True):
    index: int
    content_block: BlockOut


class TextDelta(Resp, tag_field="type", tag="text_delta", kw_only=True):
    text: str


class InputJsonDelta(Resp, tag_field="type", tag="input_json_delta", kw_only=True):
    partial_json: str


class ThinkingDelta(Resp, tag_field="type", tag="thinking_delta", kw_only=True):
    thinking: str


class SignatureDelta(Resp, tag_field="type", tag="signature_delta", kw_only=True):
    signature: str


class BlockDelta(_Event, tag="content_block_delta", kw_only=True):
    index: int
    delta: ThinkingDelta | SignatureDelta | TextDelta | InputJsonDelta


class BlockStop(_Event, tag="content_block_stop", kw_only=True):
    index: int


class StopInfo(Resp):
    stop_reason: str
    stop_sequence: str | None = None


class OutputUsage(Resp):
    output_tokens: int
    input_tokens: int | None = None


class MessageDelta(_Event, tag="message_delta", kw_only=True):
    delta: StopInfo
    usage: OutputUsage


class MessageStop(_Event, tag="message_stop", kw_only=True):
    pass


class Ping(_Event, tag="ping", kw_only=True):
    pass


StreamEvent = MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop | Ping
