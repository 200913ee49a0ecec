"""OpenAI Responses' dialect: a ``response`` object, or its stream of named events.

The stream is the documented sequence: ``response.created``, ``response.in_progress``;
for the answer's text a ``message`` item (``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` ...,
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``); for each call a ``function_call`` item (added with
empty ``arguments``, ``response.function_call_arguments.delta`` for each piece of its
arguments as they are parsed, ``.done``, done); then
``response.completed`` (``response.incomplete`` when the token limit cut the text).
Every event carries its ``sequence_number``.  The output is read in the model's own
format (:mod:`modelc.chat`): a thinking trace is a ``reasoning`` item first (its
``reasoning_text`` part streamed as ``response.reasoning_text.delta`` / ``.done``);
text that may still be a call is held back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from modelc.chat import CallDelta, Delta, StreamParser
from modelc.engine.api import FinishEvent, FinishReason, TokenEvent
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.generation import Outcome, RendererBase
from modelc.server.responses.schemas import (
    ArgumentsDelta,
    ArgumentsDone,
    Completed,
    ContentPart,
    Created,
    FunctionCallOut,
    Incomplete,
    IncompleteDetails,
    InProgress,
    InputTokensDetails,
    ItemAdded,
    ItemDone,
    MessageOut,
    OutputItem,
    OutputTextOut,
    OutputTokensDetails,
    PartAdded,
    PartDone,
    ReasoningDelta,
    ReasoningDone,
    ReasoningOut,
    ReasoningTextOut,
    ResponseObject,
    ResponsesUsage,
    StreamEvent,
    TextDelta,
    TextDone,
)
from modelc.server.schemas import FunctionCall, ToolCallOut


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _part(text: str) -> OutputTextOut:
    return OutputTextOut(text=text, annotations=[], logprobs=[])


def _call(call: ToolCallOut, status: str) -> FunctionCallOut:
    return FunctionCallOut(
        id=item_id("fc"),
        call_id=call.id,
        name=call.function.name,
        arguments=call.function.arguments,
        status=status,
    )


def _reasoning(rid: str, text: str | None, status: str) -> ReasoningOut:
    content = [] if text is None else [ReasoningTextOut(text=text)]
    return ReasoningOut(id=rid, status=status, content=content)


PREFIX = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


@dataclass(slots=True)
class _Open:
    """The output item being streamed: its kind ("reasoning", "message",
    "function_call"), id, index and text so far (a call's: its arguments; ``call`` its
    id and name)."""

    kind: str
    id: str
    index: int
    text: str = ""
    call: ToolCallOut | None = None


@dataclass(slots=True)
class ResponsesRenderer(RendererBase):
    """``/v1/responses``: ``base`` is the response as it starts (in progress, no output);
    the output read by ``reader``: the trace a ``reasoning`` item, the answer a
    ``message``, each call a ``function_call``."""

    base: ResponseObject
    n_prompt: int
    reader: tooling.OutputReader
    keep: Callable[[ResponseObject], None] | None = None  # called with the finished response
    headers: dict[str, str] = field(default_factory=lambda: sse.HEADERS)
    ping: bytes | None = sse.PING
    _seq: int = -1
    _items: list[OutputItem] = field(default_factory=list)  # the items streamed and closed
    _open: _Open | None = None
    _parser: StreamParser | None = None
    _pieces: list[str] = field(default_factory=list)  # the streamed tokens' texts

    def final(self, items: list[OutputItem], f: FinishEvent, thought: int) -> ResponseObject:
        """The finished response: its output ``items``, status and usage (``thought``:
        the output tokens that wrote the thinking trace)."""
        calls = any(isinstance(it, FunctionCallOut) for it in items)
        cut = not calls and f.reason in (FinishReason.LENGTH, FinishReason.TIMEOUT)
        usage = ResponsesUsage(
            self.n_prompt,
            f.completion_tokens,
            self.n_prompt + f.completion_tokens,
            InputTokensDetails(f.cached_tokens),
            OutputTokensDetails(reasoning_tokens=thought),
        )
        resp = msgspec.structs.replace(
            self.base,
            status="incomplete" if cut else "completed",
            output=items,
            usage=usage,
            incomplete_details=IncompleteDetails("max_output_tokens") if cut else None,
        )
        if self.keep is not None:
            self.keep(resp)
        return resp

    def body(self, outs: list[Outcome]) -> ResponseObject:
        o = outs[0]
        parser = self.reader.parser()
        got = parser.full(o.text)
        calls = tooling.calls_out(got.calls)
        items: list[OutputItem] = []
        if got.reasoning:
            items.append(_reasoning(item_id("rs"), got.reasoning, "completed"))
        if got.content or not calls:
            content = [_part(got.content)]
            items.append(MessageOut(id=item_id("msg"), status="completed", content=content))
        items += [_call(c, "completed") for c in calls]
        return self.final(items, o.finish, parser.trace_tokens([t.text for t in o.tokens]))

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, ev: StreamEvent) -> bytes:
        return sse.named(str(ev.__struct_config__.tag), ev)

    def start(self, i: int) -> list[bytes]:
        self._items, self._open, self._parser = [], None, self.reader.parser()
        self._pieces = []
        return [
            self._send(Created(sequence_number=self._next(), response=self.base)),
            self._send(InProgress(sequence_number=self._next(), response=self.base)),
        ]

    def _part_of(self, o: _Open) -> ContentPart:
        return ReasoningTextOut(text=o.text) if o.kind == "reasoning" else _part(o.text)

    def _item(self, o: _Open, status: str) -> OutputItem:
        done = status == "completed"
        if o.kind == "reasoning":
            return _reasoning(o.id, o.text if done else None, status)
        if o.call is not None:
            return FunctionCallOut(
                id=o.id,
                call_id=o.call.id,
                name=o.call.function.name,
                arguments=o.text if done else "",
                status=status,
            )
        return MessageOut(id=o.id, status=status, content=[_part(o.text)] if done else [])

    def _begin(self, kind: str, call: ToolCallOut | None = None) -> list[bytes]:
        """Open an item of ``kind`` (closing the one open)."""
        out = self._close()
        o = self._open = _Open(kind, item_id(PREFIX[kind]), len(self._items), call=call)
        seq = self._next
        added = ItemAdded(
            sequence_number=seq(), output_index=o.index, item=self._item(o, "in_progress")
        )
        out.append(self._send(added))
        if call is None:  # a message or reasoning item has a content part
            part = PartAdded(
                sequence_number=seq(),
                part=self._part_of(o),
                item_id=o.id,
                output_index=o.index,
                content_index=0,
            )
            out.append(self._send(part))
        return out

    def _piece(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        out = self._begin(kind) if self._open is None or self._open.kind != kind else []
        o = self._open
        assert o is not None
        o.text += text
        n, at = self._next(), o.index
        ev: StreamEvent
        if kind == "reasoning":
            ev = ReasoningDelta(
                sequence_number=n, delta=text, item_id=o.id, output_index=at, content_index=0
            )
        elif kind == "function_call":
            ev = ArgumentsDelta(sequence_number=n, delta=text, item_id=o.id, output_index=at)
        else:
            ev = TextDelta(
                sequence_number=n,
                delta=text,
                logprobs=[],
                item_id=o.id,
                output_index=at,
                content_index=0,
            )
        return [*out, self._send(ev)]

    def _close(self) -> list[bytes]:
        o = self._open
        if o is None:
            return []
        self._open = None
        seq = self._next
        item = self._item(o, "completed")
        self._items.append(item)
        out: list[StreamEvent] = []
        if isinstance(item, FunctionCallOut):
            out.append(
                ArgumentsDone(
                    sequence_number=seq(),
                    name=item.name,
                    arguments=item.arguments,
                    item_id=o.id,
                    output_index=o.index,
                )
            )
        else:
            at, part = o.index, self._part_of(o)
            if o.kind == "reasoning":
                out.append(
                    ReasoningDone(
                        sequence_number=seq(),
                        text=o.text,
                        item_id=o.id,
                        output_index=at,
                        content_index=0,
                    )
                )
            else:
                out.append(
                    TextDone(
                        sequence_number=seq(),
                        text=o.text,
                        logprobs=[],
                        item_id=o.id,
                        output_index=at,
                        content_index=0,
                    )
                )
            out.append(
                PartDone(
                    sequence_number=seq(), part=part, item_id=o.id, output_index=at, content_index=0
                )
            )
        out.append(ItemDone(sequence_number=seq(), output_index=o.index, item=item))
        return [self._send(ev) for ev in out]

    def _call_piece(self, c: CallDelta) -> list[bytes]:
        """A call's piece: its first opens a ``function_call`` item, each piece of its
        arguments is a ``response.function_call_arguments.delta``."""
        out = []
        if c.name is not None:
            assert c.id is not None
            out += self._begin("function_call", ToolCallOut(c.id, FunctionCall(c.name, "")))
        return out + self._piece("function_call", c.arguments)

    def _delta(self, d: Delta) -> list[bytes]:
        out = self._piece("reasoning", d.reasoning) + self._piece("message", d.content)
        for c in d.calls:
            out += self._call_piece(c)
        return out

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        assert self._parser is not None
        self._pieces.append(ev.text)
        return self._delta(self._parser.feed(ev.text))

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        assert self._parser is not None
        self._parser.feed(ev.text)
        last, whole = self._parser.finish()
        out = self._delta(last)
        if not whole.calls and not whole.content:  # no answer: one empty message
            out += self._begin("message")
        out += self._close()
        final = self.final(self._items, ev, self._parser.trace_tokens(self._pieces))
        done = Incomplete if final.status == "incomplete" else Completed
        return [*out, self._send(done(sequence_number=self._next(), response=final))]
