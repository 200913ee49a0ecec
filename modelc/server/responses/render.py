"""OpenAI Responses' dialect: a ``response`` object, or its stream of named events.

The stream is the documented sequence: ``response.created``, ``response.in_progress``;
for the answer's text a ``message`` item (``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` ...,
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``); for each call a ``function_call`` item (added,
``response.function_call_arguments.delta`` / ``.done``, done); then
``response.completed`` (``response.incomplete`` when the token limit cut the text).
Every event carries its ``sequence_number``.  The output is read in the model's own
format (:mod:`modelc.chat`): a thinking trace is a ``reasoning`` item first (its
``reasoning_text`` part streamed as ``response.reasoning_text.delta`` / ``.done``);
text that may still be a call is held back, and the calls come at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from modelc.chat import Delta, StreamParser
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
from modelc.server.schemas import ToolCallOut


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


@dataclass(slots=True)
class _Open:
    """The output item being streamed: its kind ("reasoning" / "message"), id, index
    and text so far."""

    kind: str
    id: str
    index: int
    text: str = ""


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

    def final(
        self, items: list[OutputItem], calls: list[ToolCallOut], f: FinishEvent
    ) -> ResponseObject:
        """The finished response: its output items (``calls`` after ``items``), status
        and usage."""
        items = [*items, *(_call(c, "completed") for c in calls)]
        cut = not calls and f.reason in (FinishReason.LENGTH, FinishReason.TIMEOUT)
        usage = ResponsesUsage(
            self.n_prompt,
            f.completion_tokens,
            self.n_prompt + f.completion_tokens,
            InputTokensDetails(f.cached_tokens),
            OutputTokensDetails(),
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
        got = self.reader.parser().full(o.text)
        calls = tooling.calls_out(got.calls)
        items: list[OutputItem] = []
        if got.reasoning:
            items.append(_reasoning(item_id("rs"), got.reasoning, "completed"))
        if got.content or not calls:
            content = [_part(got.content)]
            items.append(MessageOut(id=item_id("msg"), status="completed", content=content))
        return self.final(items, calls, o.finish)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, ev: StreamEvent) -> bytes:
        return sse.named(str(ev.__struct_config__.tag), ev)

    def start(self, i: int) -> list[bytes]:
        self._items, self._open, self._parser = [], None, self.reader.parser()
        return [
            self._send(Created(sequence_number=self._next(), response=self.base)),
            self._send(InProgress(sequence_number=self._next(), response=self.base)),
        ]

    def _part_of(self, o: _Open) -> ContentPart:
        return ReasoningTextOut(text=o.text) if o.kind == "reasoning" else _part(o.text)

    def _item(self, o: _Open, status: str) -> OutputItem:
        if o.kind == "reasoning":
            return _reasoning(o.id, o.text if status == "completed" else None, status)
        content = [_part(o.text)] if status == "completed" else []
        return MessageOut(id=o.id, status=status, content=content)

    def _begin(self, kind: str) -> list[bytes]:
        """Open an item of ``kind`` (closing the one open)."""
        out = self._close()
        o = self._open = _Open(
            kind, item_id("rs" if kind == "reasoning" else "msg"), len(self._items)
        )
        seq = self._next
        return [
            *out,
            self._send(
                ItemAdded(
                    sequence_number=seq(), output_index=o.index, item=self._item(o, "in_progress")
                )
            ),
            self._send(
                PartAdded(
                    sequence_number=seq(),
                    part=self._part_of(o),
                    item_id=o.id,
                    output_index=o.index,
                    content_index=0,
                )
            ),
        ]

    def _piece(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        out = self._begin(kind) if self._open is None or self._open.kind != kind else []
        o = self._open
        assert o is not None
        o.text += text
        if kind == "reasoning":
            ev: StreamEvent = ReasoningDelta(
                sequence_number=self._next(),
                delta=text,
                item_id=o.id,
                output_index=o.index,
                content_index=0,
            )
        else:
            ev = TextDelta(
                sequence_number=self._next(),
                delta=text,
                logprobs=[],
                item_id=o.id,
                output_index=o.index,
                content_index=0,
            )
        return [*out, self._send(ev)]

    def _close(self) -> list[bytes]:
        o = self._open
        if o is None:
            return []
        self._open = None
        seq = self._next
        if o.kind == "reasoning":
            done: StreamEvent = ReasoningDone(
                sequence_number=seq(),
                text=o.text,
                item_id=o.id,
                output_index=o.index,
                content_index=0,
            )
        else:
            done = TextDone(
                sequence_number=seq(),
                text=o.text,
                logprobs=[],
                item_id=o.id,
                output_index=o.index,
                content_index=0,
            )
        item = self._item(o, "completed")
        self._items.append(item)
        return [
            self._send(done),
            self._send(
                PartDone(
                    sequence_number=seq(),
                    part=self._part_of(o),
                    item_id=o.id,
                    output_index=o.index,
                    content_index=0,
                )
            ),
            self._send(ItemDone(sequence_number=seq(), output_index=o.index, item=item)),
        ]

    def _delta(self, d: Delta) -> list[bytes]:
        return self._piece("reasoning", d.reasoning) + self._piece("message", d.content)

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        assert self._parser is not None
        return self._delta(self._parser.feed(ev.text))  # calls come whole, at the end

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        assert self._parser is not None
        self._parser.feed(ev.text)
        last, whole = self._parser.finish()
        calls = tooling.calls_out(whole.calls)
        out = self._delta(last)
        if not calls and not whole.content:  # no answer: one empty message
            out += self._begin("message")
        out += self._close()
        final = self.final(self._items, calls, ev)
        for k, item in enumerate(final.output):
            if not isinstance(item, FunctionCallOut):
                continue
            seq = self._next
            start = msgspec.structs.replace(item, arguments="", status="in_progress")
            out.append(self._send(ItemAdded(sequence_number=seq(), output_index=k, item=start)))
            out.append(
                self._send(
                    ArgumentsDelta(
                        sequence_number=seq(), delta=item.arguments, item_id=item.id, output_index=k
                    )
                )
            )
            out.append(
                self._send(
                    ArgumentsDone(
                        sequence_number=seq(),
                        name=item.name,
                        arguments=item.arguments,
                        item_id=item.id,
                        output_index=k,
                    )
                )
            )
            out.append(self._send(ItemDone(sequence_number=seq(), output_index=k, item=item)))
        if final.status == "incomplete":
            out.append(self._send(Incomplete(sequence_number=self._next(), response=final)))
        else:
            out.append(self._send(Completed(sequence_number=self._next(), response=final)))
        return out
