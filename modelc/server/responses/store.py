"""The responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}``.

In memory, bounded: the last :data:`CAPACITY` responses made with ``store`` left on
(OpenAI's default); the oldest is forgotten first, and nothing survives a restart.
Each entry keeps the conversation through that response's output as chat messages
(without its ``instructions``, which OpenAI does not carry over), so a follow-up
request continues it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from modelc.server.responses.schemas import (
    FunctionCallOut,
    MessageOut,
    ReasoningOut,
    ResponseObject,
)

CAPACITY = 256


@dataclass(slots=True)
class Stored:
    response: ResponseObject
    messages: list[dict[str, Any]]  # the conversation through this response, as chat messages


def output_messages(resp: ResponseObject) -> list[dict[str, Any]]:
    """A response's output as the assistant turn of a chat conversation."""
    text = "".join(p.text for o in resp.output if isinstance(o, MessageOut) for p in o.content)
    calls = [
        {
            "id": o.call_id,
            "type": "function",
            "function": {"name": o.name, "arguments": o.arguments},
        }
        for o in resp.output
        if isinstance(o, FunctionCallOut)
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    trace = "".join(p.text for o in resp.output if isinstance(o, ReasoningOut) for p in o.content)
    if trace:
        msg["reasoning_content"] = trace
    return [msg]


class ResponseStore:
    """The last ``capacity`` responses by id."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, resp: ResponseObject, conversation: list[dict[str, Any]]) -> None:
        self._items[resp.id] = Stored(resp, [*conversation, *output_messages(resp)])
        self._items.move_to_end(resp.id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        found = self._items.get(rid)
        if found is not None:
            self._items.move_to_end(rid)
        return found

    def delete(self, rid: str) -> bool:
        return self._items.pop(rid, None) is not None
