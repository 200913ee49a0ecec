"""Gemma 4's tool turns, as llama.cpp hands them to the template.

Gemma 4's first chat templates (``google-gemma-4-31B-it.jinja`` of llama.cpp's
``models/templates/``) render a tool's results from a ``tool_responses`` field of the
model's turn, not from ``role: tool`` messages (which they would render as a turn of a
role ``tool``).  llama.cpp's server rewrites the messages for such a template
(``workaround::convert_tool_responses_gemma4``, applied when the template has
``'<|tool_call>call:'`` but not the newer ``{#- OpenAI Chat Completions:`` handling), and so
does :func:`gemma4_tool_turns`: an assistant message with tool calls, the ``tool``
messages after it and a final assistant message with content become one assistant
message with ``tool_calls``, ``tool_responses`` (``name``: the matching call's function,
else the ``tool_call_id``; ``response``: the content parsed as JSON, else as it is) and
that ``content``.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

__all__ = ["gemma4_tool_turns"]


def gemma4_tool_turns(template: str | None, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``msgs`` rewritten as llama.cpp does for an older Gemma 4 template; else unchanged."""
    text = template or ""
    if "'<|tool_call>call:'" not in text or "{#- OpenAI Chat Completions:" in text:
        return msgs
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m["role"] != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls: list[dict[str, Any]] = list(m["tool_calls"])
        responses: list[dict[str, Any]] = []
        i += 1
        while i < len(msgs) and msgs[i]["role"] == "tool":
            responses.append(_response(msgs[i], calls, len(responses)))
            i += 1
        turn: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        nxt = msgs[i] if i < len(msgs) else None
        final = nxt is not None and nxt["role"] == "assistant" and not nxt.get("tool_calls")
        if nxt is not None and final and nxt.get("content"):
            turn["content"] = nxt["content"]
            i += 1
        if m.get("reasoning_content"):
            turn["reasoning_content"] = m["reasoning_content"]
        out.append(turn)
    return out


def _response(m: dict[str, Any], calls: list[dict[str, Any]], idx: int) -> dict[str, Any]:
    response: Any = m.get("content")
    if isinstance(response, str):
        with contextlib.suppress(json.JSONDecodeError):
            response = json.loads(response)
    name = ""
    if idx < len(calls):
        name = str((calls[idx].get("function") or {}).get("name") or "")
    return {"name": name or str(m.get("tool_call_id") or ""), "response": response}
