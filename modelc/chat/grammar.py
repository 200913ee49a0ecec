"""A required or named tool call forced in the family's own syntax (as llama.cpp's
``common/chat.cpp`` builds a grammar per format), so the family's parser reads it back.

:func:`call_grammar` writes an llguidance Lark grammar: the call's markup as literals
(a marker the vocabulary has as a control token may be that token or its text), the
function's name as a literal, its arguments as ``%json`` of the tool's parameter schema
(or, for the XML formats, one ``<parameter=..>`` / ``<arg_key>`` block per property, a
string a line of text, anything else JSON).  A format with thinking markers lets the
trace through first (:func:`~modelc.chat.formats.trace_grammar`).  Formats without a
grammar here (Functionary v3.2, Gemma 4) get None: the caller forces bare JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from modelc.chat.formats import ChatFormat, trace_grammar
from modelc.json_schema import closed

Special = Callable[[str], int | None]  # a marker's control-token id, if the vocabulary has one
_COMPACT = {"whitespace_flexible": False}
NL = "\n"
QWEN_TAIL = "</function>\n</tool_call>"
# the markers of each format's call markup (each may be a control token)
_MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|tool_call|>",
    "<|python_tag|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|call|>",
    "<|end|>",
    "<|start|>",
)


class _Writer:
    """Grammar text: literals split at markers, JSON rules, extra rules."""

    def __init__(self, special: Special) -> None:
        self.special = special
        self.rules: list[str] = []

    def lit(self, text: str) -> str:
        out: list[str] = []
        rest = text
        while rest:
            at = [(rest.find(m), m) for m in _MARKERS if m in rest]
            if not at:
                out.append(json.dumps(rest))
                break
            i, m = min(at)
            if i:
                out.append(json.dumps(rest[:i]))
            tid = self.special(m)
            out.append(f"({json.dumps(m)} | <[{tid}]>)" if tid is not None else json.dumps(m))
            rest = rest[i + len(m) :]
        return " ".join(out)

    def json(self, schema: Any) -> str:
        if isinstance(schema, Mapping):  # closed as llama.cpp's (modelc/json_schema.py)
            schema = {**closed(schema), "x-guidance": _COMPACT}
        return f"%json {json.dumps(schema)}"


def _params(tool: Mapping[str, Any]) -> dict[str, Any]:
    p = tool.get("parameters")
    return dict(p) if isinstance(p, Mapping) else {"type": "object"}


def _blocks(w: _Writer, params: Mapping[str, Any], open_: str, close: str) -> str:
    """One block per property, in the schema's order (optional unless required): the
    XML formats' ``<parameter=k>\\nv\\n</parameter>`` / ``<arg_key>k</arg_key>...``."""
    props = params.get("properties")
    required = set(params.get("required") or [])
    parts = []
    for k, sub in props.items() if isinstance(props, Mapping) else []:
        string = isinstance(sub, Mapping) and sub.get("type") == "string"
        value = _line(sub) if string else w.json(sub if isinstance(sub, Mapping) else {})
        block = f"{w.lit(open_.format(k))} {value} {w.lit(close)}"
        parts.append(block if k in required else f"({block})?")
    return " ".join(parts) or '""'


def _line(schema: Mapping[str, Any]) -> str:
    """A string argument of an XML format: one line of text without ``<``, its length
    as the schema bounds it."""
    lo, hi = schema.get("minLength", 1), schema.get("maxLength")
    return f"/[^<\\n]{{{lo},{hi if isinstance(hi, int) else ''}}}/"


def _object(name: str, key: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON call object ``{"name": name, key: params}`` as a schema."""
    props = {"name": {"const": name}, key: params}
    return {
        "type": "object",
        "properties": props,
        "required": ["name", key],
        "additionalProperties": False,
    }


def _call(fmt: ChatFormat, template: str, w: _Writer, tool: Mapping[str, Any]) -> str | None:
    """One call to ``tool`` in ``fmt``'s syntax (None: no grammar for this format)."""
    name = str(tool.get("name", ""))
    params = _params(tool)
    lit = w.lit
    if fmt.name == "hermes":
        body = w.json(_object(name, "arguments", params))
        return f"{lit('<tool_call>' + NL)} {body} {lit(NL + '</tool_call>')}"
    if fmt.name == "llama3":
        return w.json(_object(name, "parameters", params))
    if fmt.name == "mistral":
        if "[ARGS]" in template:  # Small 3.2, Ministral 3, Magistral, Devstral
            return f"{lit('[TOOL_CALLS]' + name + '[ARGS]')} {w.json(params)}"
        nemo = _object(name, "arguments", params)  # Nemo: a list, each call with an id
        nemo["properties"]["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
        nemo["required"].append("id")
        return f"{lit('[TOOL_CALLS][')} {w.json(nemo)} {lit(']')}"
    if fmt.name == "qwen3-coder":
        head = lit(f"<tool_call>\n<function={name}>\n")
        blocks = _blocks(w, params, "<parameter={}>\n", "\n</parameter>\n")
        return f"{head} {blocks} {lit(QWEN_TAIL)}"
    if fmt.name == "glm-4.5":
        blocks = _blocks(w, params, "<arg_key>{}</arg_key>\n<arg_value>", "</arg_value>\n")
        return f"{lit('<tool_call>' + name + NL)} {blocks} {lit('</tool_call>')}"
    if fmt.name == "deepseek":
        if "function<｜tool▁sep｜>" in template:  # R1
            head = f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n"
            tail = "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        else:  # V3.1
            head = f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>"
            tail = "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        return f"{lit(head)} {w.json(params)} {lit(tail)}"
    if fmt.name == "kimi-k2":
        head = f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
        head += "<|tool_call_argument_begin|>"
        tail = "<|tool_call_end|><|tool_calls_section_end|>"
        return f"{lit(head)} {w.json(params)} {lit(tail)}"
    if fmt.name == "granite":
        return f"{lit('<|tool_call|>[')} {w.json(_object(name, 'arguments', params))} {lit(']')}"
    if fmt.name == "functionary-v3.1":
        return f"{lit(f'<function={name}>')} {w.json(params)} {lit('</function>')}"
    if fmt.name == "gpt-oss":
        head = f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
        return f"{lit(head)} {w.json(params)} {lit('<|call|>')}"
    return None


def call_grammar(
    fmt: ChatFormat,
    template: str | None,
    tools: Sequence[Mapping[str, Any]],
    *,
    prompt: str = "",
    special: Special = lambda _: None,
) -> str | None:
    """The grammar of one call to one of ``tools`` (``{"name", "parameters"}`` each) in
    ``fmt``'s syntax, after ``prompt``: a trace it opened comes first, one it closed
    (thinking off) cannot; else a trace may.  None when the format has no grammar here
    (see the module docstring)."""
    w = _Writer(special)
    calls = [_call(fmt, template or "", w, t) for t in tools]
    if not calls or any(c is None for c in calls):
        return None
    rules = [
        "call: " + " | ".join(f"call_{i}" for i in range(len(calls))),
        *(f"call_{i}: {c}" for i, c in enumerate(calls)),
    ]
    if fmt.name == "gpt-oss":  # an analysis message may come first
        trace = "<|channel|>analysis<|message|>"
        rules += [
            f"start: ({w.lit(trace)} ANALYSIS {w.lit('<|end|><|start|>assistant')})? call",
            "ANALYSIS: /[^<]*/",
        ]
        return "\n".join(["%llguidance {}", *rules]) + "\n"
    closed = fmt.think is not None and prompt.rstrip().endswith(fmt.think[1].strip())
    head = None if closed else trace_grammar(fmt, bool(fmt.lead(prompt)), "call")
    if head is None:
        return "\n".join(["%llguidance {}", "start: call", *rules]) + "\n"
    return head + "\n".join(rules) + "\n"
