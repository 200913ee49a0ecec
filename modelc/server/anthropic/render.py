"""Anthropic's dialect: a ``message`` body, or its stream of named events.

The stream is Anthropic's: ``message_start``, ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (``thinking_delta`` then one
``signature_delta``, ``text_delta``, ``input_json_delta``) / ``content_block_stop``,
then ``message_delta`` (``stop_reason``, usage) and ``message_stop``; ``ping`` again
while nothing happens.  The output is read in the model's own format
(:mod:`modelc.chat`): a thinking trace streams in its own ``thinking`` block before the
answer's ``text`` block; text that may still be a call is held back; each call is a
``tool_use`` block that starts with an empty ``input`` and streams its arguments' JSON
as it is parsed (``input_json_delta`` pieces whose concatenation is that JSON).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from modelc.chat import CallDelta, Delta, StreamParser
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
    SignatureDelta,
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


def signature(thinking: str) -> str:
    """A thinking block's ``signature``: the trace's SHA-256, base64 (Anthropic's is an
    encrypted check; this one only lets a client see the block is whole)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def tool_use_id(call_id: str) -> str:
    return call_id.replace("call_", "toolu_", 1)


def tool_use(call: ToolCallOut) -> ToolUseOut:
    """A parsed call as a ``tool_use`` block (its arguments as the ``input`` object)."""
    try:
        args: Any = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        args = {}
    return ToolUseOut(
        id=tool_use_id(call.id),
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
    _open: str = ""  # the kind of the open block ("thinking", "text", "tool_use"; "": none)
    _thinking: str = ""  # the open thinking block's text so far (its signature's input)
    _calls: dict[int, int] = field(default_factory=dict)  # call index -> its block's index
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
        content: list[BlockOut] = []
        if got.reasoning:
            content.append(ThinkingOut(thinking=got.reasoning, signature=signature(got.reasoning)))
        if got.content or not calls:
            content.append(TextOut(text=got.content))
        content += [tool_use(c) for c in calls]
        return self._message(content, o.finish, bool(calls))

    def start(self, i: int) -> list[bytes]:
        self._index, self._open, self._parser = -1, "", self.reader.parser()
        self._thinking, self._calls = "", {}
        return [event(MessageStart(message=self._message([], None, False))), PING]

    def _close(self) -> list[bytes]:
        out = []
        if self._open == "thinking":
            sig = SignatureDelta(signature=signature(self._thinking))
            out.append(event(BlockDelta(index=self._index, delta=sig)))
        if self._open:
            out.append(event(BlockStop(index=self._index)))
        self._open = ""
        return out

    def _begin(self, block: BlockOut) -> list[bytes]:
        """Close the open block and open ``block`` after it."""
        out = self._close()
        self._index += 1
        self._open, self._thinking = str(block.__struct_config__.tag), ""
        return [*out, event(BlockStart(index=self._index, content_block=block))]

    def _piece(self, kind: str, text: str) -> list[bytes]:
        """``text`` into the open block of ``kind`` (opening it, closing another)."""
        if not text:
            return []
        out = []
        if self._open != kind:
            out += self._begin(ThinkingOut(thinking="") if kind == "thinking" else TextOut(text=""))
        if kind == "thinking":
            self._thinking += text
        delta = ThinkingDelta(thinking=text) if kind == "thinking" else TextDelta(text=text)
        out.append(event(BlockDelta(index=self._index, delta=delta)))
        return out

    def _call(self, c: CallDelta) -> list[bytes]:
        """A call's piece: its first opens a ``tool_use`` block (empty ``input``), each
        piece of its arguments is an ``input_json_delta``."""
        out = []
        if c.name is not None:
            assert c.id is not None
            out += self._begin(ToolUseOut(id=tool_use_id(c.id), name=c.name, input={}))
            self._calls[c.index] = self._index
        if c.arguments:
            args = InputJsonDelta(partial_json=c.arguments)
            out.append(event(BlockDelta(index=self._calls[c.index], delta=args)))
        return out

    def _delta(self, d: Delta) -> list[bytes]:
        out = self._piece("thinking", d.reasoning) + self._piece("text", d.content)
        for c in d.calls:
            out += self._call(c)
        return out

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        assert self._parser is not None
        return self._delta(self._parser.feed(ev.text))

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        assert self._parser is not None
        self._parser.feed(ev.text)
        last, whole = self._parser.finish()
        out = self._delta(last)
        if not whole.calls and not whole.content:  # no answer: one empty text block
            out += self._begin(TextOut(text=""))
        out += self._close()
        reason, seq = stop_reason(ev, bool(whole.calls), self.stops)
        usage = OutputUsage(output_tokens=ev.completion_tokens)
        out.append(event(MessageDelta(delta=StopInfo(reason, seq), usage=usage)))
        out.append(event(MessageStop()))
        return out
