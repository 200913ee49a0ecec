"""Anthropic's dialect: a ``message`` body, or its stream of named events.

The stream is Anthropic's: ``message_start``, ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``)
/ ``content_block_stop``, then ``message_delta`` (``stop_reason``, usage) and
``message_stop``; ``ping`` again while nothing happens.  The output is read in the
model's own format (:mod:`modelc.chat`): a thinking trace streams as ``thinking_delta``
in its own ``thinking`` block before the answer's ``text`` block; text that may still
be a call is held back, and the calls come as ``tool_use`` blocks at the end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from modelc.chat import Delta, StreamParser
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
    ThinkingDelta,
    ThinkingOut,
    ToolUseOut,
)
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
    """``/v1/messages``: one message (Anthropic has no ``n``), read by ``reader``: the
    trace a ``thinking`` block, the answer a ``text`` block, each call a ``tool_use``."""

    mid: str
    model: str
    n_prompt: int
    reader: tooling.OutputReader
    stops: list[str]
    headers: dict[str, str] = field(default_factory=lambda: sse.HEADERS)
    ping: bytes | None = PING
    _index: int = -1  # the last content block opened
    _open: str = ""  # the kind of the open block ("thinking", "text"; "": none)
    _parser: StreamParser | None = None

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
        got = self.reader.parser().full(o.text)
        calls = tooling.calls_out(got.calls)
        content: list[BlockOut] = [ThinkingOut(thinking=got.reasoning)] if got.reasoning else []
        if got.content or not calls:
            content.append(TextOut(text=got.content))
        content += [tool_use(c) for c in calls]
        return self._message(content, o.finish, bool(calls))

    def start(self, i: int) -> list[bytes]:
        self._index, self._open, self._parser = -1, "", self.reader.parser()
        return [event(MessageStart(message=self._message([], None, False))), PING]

    def _close(self) -> list[bytes]:
        if not self._open:
            return []
        self._open = ""
        return [event(BlockStop(index=self._index))]

    def _piece(self, kind: str, text: str) -> list[bytes]:
        """``text`` into the open block of ``kind`` (opening it, closing another)."""
        if not text:
            return []
        out = []
        if self._open != kind:
            out += self._close()
            self._index += 1
            self._open = kind
            block = ThinkingOut(thinking="") if kind == "thinking" else TextOut(text="")
            out.append(event(BlockStart(index=self._index, content_block=block)))
        delta = ThinkingDelta(thinking=text) if kind == "thinking" else TextDelta(text=text)
        out.append(event(BlockDelta(index=self._index, delta=delta)))
        return out

    def _delta(self, d: Delta) -> list[bytes]:
        return self._piece("thinking", d.reasoning) + self._piece("text", d.content)

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        assert self._parser is not None
        return self._delta(self._parser.feed(ev.text))  # calls come whole, at the end

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        assert self._parser is not None
        self._parser.feed(ev.text)
        last, whole = self._parser.finish()
        calls = tooling.calls_out(whole.calls)
        out = self._delta(last)
        if not calls and not whole.content:  # no answer: one empty text block
            out += self._close()
            self._index += 1
            out.append(event(BlockStart(index=self._index, content_block=TextOut(text=""))))
            self._open = "text"
        out += self._close()
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
