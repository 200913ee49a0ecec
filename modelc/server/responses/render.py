"""OpenAI Responses' dialect: a ``response`` object, or its stream of named events.

The stream is the documented sequence: ``response.created``, ``response.in_progress``;
for the answer's text a ``message`` item (``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` ...,
``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``); for each call a ``function_call`` item (added,
``response.function_call_arguments.delta`` / ``.done``, done); then
``response.completed`` (``response.incomplete`` when the token limit cut the text).
Every event carries its ``sequence_number``.  With tools, text that may still be a
call is held back until it is known not to be one (as the chat route does).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from modelc.engine.api import FinishEvent, FinishReason, TokenEvent
from modelc.server import sse
from modelc.server import tools as tooling
from modelc.server.conversation import CallHold
from modelc.server.generation import Outcome, RendererBase
from modelc.server.responses.schemas import (
    ArgumentsDelta,
    ArgumentsDone,
    Completed,
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


@dataclass(slots=True)
class ResponsesRenderer(RendererBase):
    """``/v1/responses``: ``base`` is the response as it starts (in progress, no output)."""

    base: ResponseObject
    n_prompt: int
    tools: bool
    keep: Callable[[ResponseObject], None] | None = None  # called with the finished response
    headers: dict[str, str] = field(default_factory=lambda: sse.HEADERS)
    ping: bytes | None = sse.PING
    _seq: int = -1
    _msg: str = ""  # the message item's id, once opened
    _text: str = ""  # the message's text so far
    _hold: CallHold = field(default_factory=CallHold)

    def final(self, text: str | None, calls: list[ToolCallOut], f: FinishEvent) -> ResponseObject:
        """The finished response: its output items, status and usage."""
        items: list[OutputItem] = []
        if text or not calls:
            msg = MessageOut(
                id=self._msg or item_id("msg"), status="completed", content=[_part(text or "")]
            )
            items.append(msg)
        items += [_call(c, "completed") for c in calls]
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
        text, calls = tooling.parse_tool_calls(o.text) if self.tools else (o.text, [])
        return self.final(text, calls, o.finish)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, ev: StreamEvent) -> bytes:
        return sse.named(str(ev.__struct_config__.tag), ev)

    def start(self, i: int) -> list[bytes]:
        self._msg, self._text, self._hold = "", "", CallHold(self.tools)
        return [
            self._send(Created(sequence_number=self._next(), response=self.base)),
            self._send(InProgress(sequence_number=self._next(), response=self.base)),
        ]

    def _open(self) -> list[bytes]:
        if self._msg:
            return []
        self._msg = item_id("msg")
        item = MessageOut(id=self._msg, status="in_progress", content=[])
        return [
            self._send(ItemAdded(sequence_number=self._next(), output_index=0, item=item)),
            self._send(
                PartAdded(
                    sequence_number=self._next(),
                    item_id=self._msg,
                    output_index=0,
                    content_index=0,
                    part=_part(""),
                )
            ),
        ]

    def _delta(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = self._open()
        self._text += text
        delta = TextDelta(
            sequence_number=self._next(),
            item_id=self._msg,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )
        return [*out, self._send(delta)]

    def token(self, i: int, ev: TokenEvent) -> list[bytes]:
        return self._delta(self._hold.feed(ev.text))

    def _close_message(self) -> list[bytes]:
        seq, msg = self._next, self._msg
        done = MessageOut(id=self._msg, status="completed", content=[_part(self._text)])
        return [
            self._send(
                TextDone(
                    sequence_number=seq(),
                    text=self._text,
                    logprobs=[],
                    item_id=msg,
                    output_index=0,
                    content_index=0,
                )
            ),
            self._send(
                PartDone(
                    sequence_number=seq(),
                    part=_part(self._text),
                    item_id=msg,
                    output_index=0,
                    content_index=0,
                )
            ),
            self._send(ItemDone(sequence_number=self._next(), output_index=0, item=done)),
        ]

    def finish(self, i: int, ev: FinishEvent) -> list[bytes]:
        held, calls = self._hold.end(ev.text)
        out = self._delta(held)
        if not calls:
            out += self._open()  # an empty answer is one empty message
        if self._msg:
            out += self._close_message()
        final = self.final(self._text if self._msg else None, calls, ev)
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
