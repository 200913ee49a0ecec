"""The incremental parser: text deltas in, trace / answer / call-argument deltas out.

Each fed delta re-reads the output so far as a *partial* parse (which holds back
anything that may still change: a marker's first characters, blanks before a possible
call) and sends what grew since the last one, as OpenAI streams ``tool_calls``: a
call's first delta carries its index, id and name, later ones argument text.  At the
end the full parse sends the rest, so the deltas joined equal :func:`parse` of the
whole text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelc.chat.formats import ChatFormat, new_call_id, parse, trace_end
from modelc.chat.scan import Parsed, ToolCall, param_types


@dataclass(slots=True)
class CallDelta:
    """A piece of call ``index``: ``id`` and ``name`` on its first piece only."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class Delta:
    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


def _grow(old: str, new: str) -> str:
    return new[len(old) :] if len(new) > len(old) and new.startswith(old) else ""


class StreamParser:
    """Parses one output as it arrives (see the module docstring)."""

    def __init__(
        self,
        fmt: ChatFormat,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        reasoning: bool = True,
        prompt: str = "",
        parallel: bool = True,
    ) -> None:
        self.fmt = fmt
        self.tools = bool(tools)
        self.parallel = parallel  # False: the first call only (parallel_tool_calls)
        self.reasoning = reasoning
        self.lead = fmt.lead(prompt)
        self.types = param_types(tools)
        self.text = self.lead
        self.sent = Parsed()
        self.ids: list[str] = []

    def full(self, text: str) -> Parsed:
        """The whole-output parse, calls given ids."""
        out = self._parse(self.lead + text, partial=False)
        for k in out.calls:
            k.id = k.id or new_call_id()
        return out

    def trace_tokens(self, pieces: Sequence[str]) -> int:
        """How many of the output's tokens (their texts ``pieces``, in order) wrote its
        thinking trace, markers included (0 when the trace is not split off)."""
        if not self.reasoning:
            return 0
        end = trace_end(self.fmt, self.lead + "".join(pieces)) - len(self.lead)
        n = at = 0
        for p in pieces:
            if at >= end:
                break
            n, at = n + 1, at + len(p)
        return n

    def _parse(self, text: str, *, partial: bool) -> Parsed:
        out = parse(
            self.fmt,
            text,
            tools=self.tools,
            reasoning=self.reasoning,
            types=self.types,
            partial=partial,
        )
        if not self.parallel:
            del out.calls[1:]
        return out

    def feed(self, text: str) -> Delta:
        """The deltas that ``text`` (the next piece of output) makes certain."""
        self.text += text
        return self._diff(self._parse(self.text, partial=True))

    def finish(self) -> tuple[Delta, Parsed]:
        """The last deltas, and the whole output's parse (ids as streamed)."""
        d = self._diff(self._parse(self.text, partial=False))
        return d, Parsed(
            self.sent.reasoning,
            self.sent.content,
            [ToolCall(k.name, k.arguments, k.id) for k in self.sent.calls],
        )

    def _diff(self, new: Parsed) -> Delta:
        d, sent = Delta(), self.sent
        d.reasoning = _grow(sent.reasoning, new.reasoning)
        sent.reasoning += d.reasoning
        d.content = _grow(sent.content, new.content)
        sent.content += d.content
        for k, call in enumerate(new.calls):
            if k < len(sent.calls):
                more = _grow(sent.calls[k].arguments, call.arguments)
                if more:
                    sent.calls[k].arguments += more
                    d.calls.append(CallDelta(k, more))
            elif k == len(sent.calls) and call.name:
                cid = call.id or new_call_id()
                sent.calls.append(ToolCall(call.name, call.arguments, cid))
                d.calls.append(CallDelta(k, call.arguments, cid, call.name))
        return d
