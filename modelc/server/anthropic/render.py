"""Anthropic's dialect: a ``message`` body, or its stream of named events.

The stream is Anthropic's: ``message_start``, ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``)
/ ``content_block_stop``, then ``message_delta`` (``stop_reason``, usage) and
``message_stop``; ``ping`` again while nothing happens.  With tools, text that may
still be a call is held back until it is known not to be one (as the chat route does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from modelc.engine.api import FinishEvent, FinishReason, TokenEvent
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.anthropic.schemas import (
    AnthropicUsage,
    BlockDelta,
    BlockOut,
    BlockStart,
    BlockStop,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageStart,
    MessageStop,
    OutputUsage,
    Ping,
    StopInfo,
    StreamEvent,
    TextDelta,
    TextOut,
    ToolUseOut,
)
from modelc.server.conversation import CallHold
from modelc.server.generation import Outcome, RendererBase
from modelc.server.schemas import ToolCallOut


def event(ev: StreamEvent) -> bytes:
    """One named server-sent event: ``event: <type>`` and its JSON ``data``."""
    return sse.named(str(ev.__struct_config__.tag), ev)


PING = event(Ping())


def tool_use(call: ToolCallOut) -> ToolUseOut:
    """A parsed call as a ``tool_use`` block (its arguments as the ``input`` object)."""
    try:
        args: Any = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        args = {}
    return ToolUseOut(
        id=call.id.replace("call_", "toolu_", 1),
        name=call.function.name,
        input=args if isinstance(args, dict) else {},
    )


def stop_reason(f: FinishEvent, calls: bool, stops: list[str]) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``) for how the text ended."""
    if calls:
        return "tool_use", None
    if f.reason in (FinishReason.LENGTH, FinishReason.TIMEOUT):
        return "max_tokens", None
    if f.stop_word and f.stop_word in stops:
        return "stop_sequence", f.stop_word
    return "end_turn", None


@dataclass(slots=True)
class MessagesRenderer(RendererBase):
    """``/v1/messages``: one message (Anthropic has no ``n``)."""

    mid: str
    model: str
    n_prompt: int
    tools: bool
    stops: list[str]
    headers: dict[str, str] = field(default_factory=lambda: sse.HEADERS)
    ping: bytes | None = PING
    _index: int = -1  # the last content block opened
    _text_open: bool = False
    _hold: CallHold = field(default_factory=CallHold)

    def _message(self, content: list[BlockOut], f: FinishEvent | None, calls: bool) -> Message:
        reason, seq = stop_reason(f, calls, self.stops) if f is not None else (None, None)
        out = f.completion_tokens if f is not None else 0
        usage = AnthropicUsage(
            input_tokens=self.n_prompt,
            output_tokens=out,
            cache_read_input_tokens=f.cached_tokens if f is not None else 0,
        )
        return Message(
            id=self.mid,
            model=self.model,
            content=content,
            stop_reason=reason,
            stop_sequence=seq,
            usage=usage,
        )

    def body(self, outs: list[Outcome]) -> Message:
        o = outs[0]
        text: str | None = o.text
        calls: list[ToolCallOut] = []
        if self.tools:
            text, calls = tooling.parse_tool_calls(o.text)
        content: list[BlockOut] = [TextOut(text=text or "")] if text or not calls else []
        content += [tool_use(c) for c in calls]
        return self._message(content, o.finish, bool(calls))

    def start(self, i: int) -> list[bytes]:
        self._index, self._text_open, self._hold = -1, False, CallHold(self.tools)
        return [event(MessageStart(message=self._message([], None, False))), PING]

    def _text(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = []
        if not self._text_open:
            self._index += 1
            self._text_open = True
            out.append(event(BlockStart(index=self._index, content_block=TextOut(text=""))))
        out.append(event(BlockDelta(index=self._index, delta=TextDelta(text=text))))
        return out

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        return self._text(self._hold.feed(ev.text))

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        held, calls = self._hold.end(ev.text)
        out = self._text(held)
        if not calls and self._index < 0:  # an empty answer is one empty text block
            self._index, self._text_open = 0, True
            out.append(event(BlockStart(index=0, content_block=TextOut(text=""))))
        if self._text_open:
            out.append(event(BlockStop(index=self._index)))
        for call in calls:
            self._index += 1
            block = tool_use(call)
            head = ToolUseOut(id=block.id, name=block.name, input={})
            out.append(event(BlockStart(index=self._index, content_block=head)))
            args = InputJsonDelta(partial_json=json.dumps(block.input, ensure_ascii=False))
            out.append(event(BlockDelta(index=self._index, delta=args)))
            out.append(event(BlockStop(index=self._index)))
        reason, seq = stop_reason(ev, bool(calls), self.stops)
        usage = OutputUsage(output_tokens=ev.completion_tokens)
        out.append(event(MessageDelta(delta=StopInfo(reason, seq), usage=usage)))
        out.append(event(MessageStop()))
        return out
