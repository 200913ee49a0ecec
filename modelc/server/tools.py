"""Tool calling: constraining and parsing the model's calls.

(Offering the tools is the prompt format's job: :meth:`~modelc.runtime.prompt.PromptFormat.chat`
passes them to the template, or as a Hermes-style system prompt to a template that does
not take them.)  The model answers a call as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (SmolLM2, Hermes,
Qwen) or as a bare JSON object with ``name`` and ``arguments``; :func:`parse_tool_calls`
accepts both.  ``tool_choice`` ``required`` or a named function compiles to a JSON
schema :class:`~modelc.engine.api.Constraint`, so the output is always a valid call.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from modelc.engine.api import Constraint, ConstraintKind
from modelc.server.errors import ParamError
from modelc.server.schemas import FunctionCall, NamedToolChoice, Tool, ToolCallOut

_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _call_schema(t: Tool) -> dict[str, Any]:
    params = t.function.parameters or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": t.function.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def choice_constraint(tools: list[Tool], choice: str | NamedToolChoice | None) -> Constraint | None:
    """The constraint that forces a call for ``required`` / a named function; else None."""
    if isinstance(choice, NamedToolChoice):
        match = [t for t in tools if t.function.name == choice.function.name]
        if not match:
            raise ParamError(
                f"tool_choice names {choice.function.name!r}, which is not in tools",
                param="tool_choice",
            )
        return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(_call_schema(match[0])))
    if choice == "required":
        schemas = [_call_schema(t) for t in tools]
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))
    return None


def _as_call(obj: Any) -> FunctionCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return FunctionCall(name=obj["name"], arguments=text)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCallOut]]:
    """(remaining content or None, calls) from the model's output; no calls -> (text, [])."""
    calls: list[ToolCallOut] = []
    if "<tool_call>" in text:
        for m in _CALL_RE.finditer(text):
            try:
                call = _as_call(json.loads(m.group(1)))
            except json.JSONDecodeError:
                call = None
            if call is not None:
                calls.append(ToolCallOut(id=new_call_id(), function=call))
        if calls:
            rest = _CALL_RE.sub("", text).strip()
            return (rest or None), calls
        return text, []
    s = text.strip()
    if s.startswith(("{", "[")):
        try:
            obj = json.loads(s)
        except json.JSONDecodeError:
            return text, []
        items = obj if isinstance(obj, list) else [obj]
        parsed = [_as_call(o) for o in items]
        if parsed and all(c is not None for c in parsed):
            return None, [ToolCallOut(id=new_call_id(), function=c) for c in parsed if c]
    return text, []


def may_be_call(text: str) -> bool:
    """True while streamed text could still turn out to be a tool call."""
    s = text.lstrip()
    if not s:
        return True
    return (
        s.startswith(("{", "[")) or "<tool_call>".startswith(s[:11]) or s.startswith("<tool_call>")
    )
