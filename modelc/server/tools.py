"""Tool calling and thinking traces on the chat routes: constraining the calls and
reading the output.

(Offering the tools is the prompt format's job: :meth:`~modelc.runtime.prompt.PromptFormat.chat`
passes them to the template, or as a Hermes-style system prompt to a template that does
not take them.)  The model answers in its family's format, which :mod:`modelc.chat`
detects from the template and parses (:func:`output_reader`); SmolLM2, Hermes and Qwen
write ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` or a bare JSON call.
``tool_choice`` ``required`` or a named function compiles to a grammar of a call in
the family's own syntax (:mod:`modelc.chat.grammar`; bare JSON for a family without
one), so the output is always a valid call the family's parser reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from modelc import chat
from modelc.chat import StreamParser, new_call_id
from modelc.chat.calls import bare_json, hermes
from modelc.engine.api import Constraint, ConstraintKind
from modelc.server.errors import ParamError
from modelc.server.schemas import FunctionCall, NamedToolChoice, Tool, ToolCallOut

HERMES = chat.ChatFormat("hermes", hermes)
BARE_JSON = chat.ChatFormat("json", bare_json)  # a call forced by a JSON-schema constraint


def _call_schema(t: Tool) -> dict[str, Any]:
    params = t.function.parameters or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": t.function.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


@dataclass(frozen=True, slots=True)
class ForcedCall:
    """A call forced by ``tool_choice``: the constraint, and the format it is written in."""

    constraint: Constraint
    fmt: chat.ChatFormat


def forced_tools(tools: list[Tool], choice: str | NamedToolChoice | None) -> list[Tool]:
    """The tools a ``required`` / named ``tool_choice`` forces a call to (none: free)."""
    if isinstance(choice, NamedToolChoice):
        match = [t for t in tools if t.function.name == choice.function.name]
        if not match:
            raise ParamError(
                f"tool_choice names {choice.function.name!r}, which is not in tools",
                param="tool_choice",
            )
        return match[:1]
    return list(tools) if choice == "required" else []


def choice_constraint(
    tools: list[Tool],
    choice: str | NamedToolChoice | None,
    *,
    template: str | None = None,
    prompt: str = "",
    special: chat.Special = lambda _: None,
) -> ForcedCall | None:
    """The constraint that forces a call for ``required`` / a named function, in the
    family's own syntax (:func:`modelc.chat.call_grammar`) where it has a grammar, else
    as bare JSON; None when no call is forced."""
    forced = forced_tools(tools, choice)
    if not forced:
        return None
    fmt = chat.detect(template)
    plain = [{"name": t.function.name, "parameters": t.function.parameters} for t in forced]
    grammar = chat.call_grammar(fmt, template, plain, prompt=prompt, special=special)
    if grammar is not None:
        return ForcedCall(Constraint(ConstraintKind.GRAMMAR, grammar), fmt)
    schemas = [_call_schema(t) for t in forced]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return ForcedCall(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema)), BARE_JSON)


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCallOut]]:
    """(remaining content or None, calls) of a Hermes-format output; no calls -> (text, [])."""
    got = StreamParser(HERMES, tools=[{}]).full(text)
    if not got.calls:
        return text, []
    return (got.content.strip() or None), calls_out(got.calls)


def calls_out(calls: list[chat.ToolCall]) -> list[ToolCallOut]:
    return [ToolCallOut(c.id or new_call_id(), FunctionCall(c.name, c.arguments)) for c in calls]


@dataclass(frozen=True, slots=True)
class OutputReader:
    """How one chat request's output is read: the model's format, the prompt that led to
    it (a trace it opened), the offered tools, and whether the trace is split off."""

    fmt: chat.ChatFormat
    prompt: str = ""
    tools: list[dict[str, Any]] | None = None
    reasoning: bool = True
    parallel: bool = True  # parallel_tool_calls: false keeps the first call

    def parser(self) -> StreamParser:
        return StreamParser(
            self.fmt,
            tools=self.tools,
            reasoning=self.reasoning,
            prompt=self.prompt,
            parallel=self.parallel,
        )


def output_reader(
    template: str | None,
    prompt: str,
    tools: list[Tool] | None,
    *,
    reasoning: bool = True,
    forced: chat.ChatFormat | None = None,
    parallel: bool = True,
) -> OutputReader:
    """The reader for a chat answer: the format detected from the model's template, or
    ``forced``: the format a call forced by ``tool_choice`` is written in."""
    fmt = forced or chat.detect(template)
    plain_tools = [msgspec.to_builtins(t) for t in tools] if tools else None
    return OutputReader(fmt, prompt, plain_tools, reasoning, parallel)


def template_kwargs(given: dict[str, Any] | None, effort: str | None) -> dict[str, Any]:
    """A request's template variables: ``chat_template_kwargs``, and ``reasoning_effort``
    (gpt-oss's template reads it) unless they set it."""
    kwargs = dict(given or {})
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
    return kwargs


def after_trace(c: Constraint | None, reader: OutputReader) -> Constraint | None:
    """A JSON answer constraint let through the model's thinking trace first (as
    llama.cpp's reasoning parsers do); other constraints (and traceless formats) as given."""
    if c is None or c.kind not in (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT):
        return c
    if not reader.reasoning:
        return c
    try:
        schema = json.loads(c.value) if c.kind is ConstraintKind.JSON_SCHEMA else {"type": "object"}
    except json.JSONDecodeError:
        return c  # the engine refuses it with its own message
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": {"whitespace_flexible": False}}
    answer = f"%json {json.dumps(schema)}"
    grammar = chat.trace_grammar(reader.fmt, bool(reader.fmt.lead(reader.prompt)), answer)
    return c if grammar is None else Constraint(ConstraintKind.GRAMMAR, grammar)


def may_be_call(text: str) -> bool:
    """True while streamed text could still turn out to be a tool call."""
    s = text.lstrip()
    if not s:
        return True
    return (
        s.startswith(("{", "[")) or "<tool_call>".startswith(s[:11]) or s.startswith("<tool_call>")
    )
