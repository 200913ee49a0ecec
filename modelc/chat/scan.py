"""The pieces every output-format parser shares: the parse result, held marker prefixes,
JSON spans and XML-style parameter values.

A parser reads the model's whole output so far.  With ``partial`` it must return only
what can no longer change: text that may be the start of a marker is held back, and a
tool call's arguments grow only at their end.  The streaming parser
(:mod:`modelc.chat.stream`) sends the difference between two such parses, so a
streamed answer equals the full parse of the same text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCall:
    """One call the model made: ``arguments`` is JSON text (possibly still growing)."""

    name: str
    arguments: str = ""
    id: str | None = None  # the model's own id (Mistral, Kimi-K2), else the server makes one


@dataclass(slots=True)
class Parsed:
    """A parsed output: the thinking trace, the answer, the tool calls."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


ParamTypes = Mapping[str, Mapping[str, str]]  # function name -> parameter -> JSON type


def param_types(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, str]]:
    """Each offered function's parameter types (from OpenAI tool objects)."""
    out: dict[str, dict[str, str]] = {}
    for t in tools or ():
        fn = t.get("function") if isinstance(t.get("function"), Mapping) else t
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn["name"]] = {
            k: str(v.get("type") or "") for k, v in props.items() if isinstance(v, Mapping)
        }
    return out


def held(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``text`` may begin one of ``markers``."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


def cut(text: str, markers: Sequence[str], partial: bool) -> str:
    """``text`` less a trailing start of a marker when ``partial``."""
    n = held(text, markers) if partial else 0
    return text[: len(text) - n] if n else text


def find_first(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str]:
    """The earliest of ``markers`` in ``text`` from ``start``: (index, marker) or (-1, "")."""
    best, which = -1, ""
    for m in markers:
        i = text.find(m, start)
        if i >= 0 and (best < 0 or i < best):
            best, which = i, m
    return best, which


def json_end(text: str, start: int) -> int:
    """The end of the JSON object/array opening at ``text[start]``, or -1 if unclosed."""
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def as_json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def call_from_obj(obj: Any) -> ToolCall | None:
    """A call from ``{"name": .., "arguments"|"parameters": ..}`` (or None)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    cid = obj.get("id")
    return ToolCall(obj["name"], as_json_text(args), cid if isinstance(cid, str) else None)


def xml_value(raw: str, kind: str) -> str:
    """A parameter's text as a JSON value: a string parameter stays a string; otherwise
    the text read as JSON when it is JSON, else as a string (llama.cpp's rule)."""
    v = raw.strip("\n") if raw.strip() else raw
    if kind != "string":
        try:
            return json.dumps(json.loads(v), ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    return json.dumps(v, ensure_ascii=False)


def xml_args(pairs: Sequence[tuple[str, str]], closed: bool, types: Mapping[str, str]) -> str:
    """The JSON arguments text of completed (key, raw value) pairs; ``}`` once closed.
    The text only grows as pairs complete, so it streams."""
    body = ", ".join(
        f"{json.dumps(k, ensure_ascii=False)}: {xml_value(v, types.get(k, ''))}" for k, v in pairs
    )
    return "{" + body + ("}" if closed else "")
