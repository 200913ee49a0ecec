"""Tool-call parsers for the formats that write arguments as tags, not JSON:
Qwen3-Coder / Qwen3.5, GLM-4.x, Gemma 4, and gpt-oss's harmony channels (which also
carry the thinking trace)."""

from __future__ import annotations

import json
import re

from modelc.chat.calls import blocks, one
from modelc.chat.scan import ParamTypes, Parsed, ToolCall, cut, find_first, xml_args

_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def qwen3_coder(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """``<tool_call>\\n<function=name>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>
    \\n</tool_call>`` (Qwen3-Coder, Qwen3.5, Nemotron 3)."""

    def read(body: str, unclosed: bool) -> ToolCall | None:
        s = body.find("<function=")
        gt = body.find(">", s) if s >= 0 else -1
        if gt < 0:
            return None
        name = body[s + len("<function=") : gt].strip()
        closed = "</function>" in body
        pairs = [(k.strip(), v) for k, v in _PARAM.findall(body, gt)]
        return ToolCall(name, xml_args(pairs, closed or not unclosed, types.get(name, {})))

    return blocks(text, partial, "<tool_call>", "</tool_call>", one(read))


def glm(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """GLM-4.5/4.6/4.7: ``<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>
    </tool_call>``."""

    def read(body: str, unclosed: bool) -> ToolCall | None:
        lt = body.find("<")
        if lt < 0 and unclosed:
            return None
        name = (body[:lt] if lt >= 0 else body).strip()
        if not name:
            return None
        pairs = [(k.strip(), v) for k, v in _ARG.findall(body)]
        return ToolCall(name, xml_args(pairs, not unclosed, types.get(name, {})))

    return blocks(text, partial, "<tool_call>", "</tool_call>", one(read))


_Q = '<|"|>'
_KEY = re.compile(r'([{,]\s*)([^:{}\[\],"\s][^:{}\[\],"]*?)\s*:')


def gemma4_args(s: str) -> str:
    """Gemma 4's ``{key:<|"|>text<|"|>,n:1}`` as JSON text."""
    pieces = s.split(_Q)
    out = [
        json.dumps(p, ensure_ascii=False)
        if k % 2
        else _KEY.sub(lambda m: m.group(1) + json.dumps(m.group(2).strip()) + ":", p)
        for k, p in enumerate(pieces)
    ]
    return json.dumps(json.loads("".join(out)), ensure_ascii=False)


def gemma4(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """Gemma 4: ``<|tool_call>call:name{key:<|"|>value<|"|>}<tool_call|>``."""

    def read(body: str, unclosed: bool) -> ToolCall | None:
        if unclosed:
            return None
        head, brace, rest = body.partition("{")
        if not head.startswith("call:") or not brace:
            return None
        try:
            return ToolCall(head[len("call:") :].strip(), gemma4_args("{" + rest))
        except json.JSONDecodeError:
            return None

    return blocks(text, partial, "<|tool_call>", "<tool_call|>", one(read))


_HARMONY = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


def harmony(text: str, partial: bool, types: ParamTypes, *, keep_analysis: bool = False) -> Parsed:
    """gpt-oss: ``<|channel|>analysis<|message|>..<|end|>`` is the trace,
    ``<|start|>assistant<|channel|>final<|message|>..`` the answer, and
    ``<|channel|>commentary to=functions.name <|constrain|>json<|message|>{..}<|call|>``
    a call (the recipient may also stand before ``<|channel|>``).  ``keep_analysis``
    leaves the trace's message as written in the content (llama.cpp's
    ``reasoning_format: none``)."""
    out, pos = Parsed(), 0
    if "<|message|>" not in text and not partial and "<|channel|>" not in text:
        out.content = text  # no channels at all: plain text
        return out
    while pos < len(text):
        m = text.find("<|message|>", pos)
        if m < 0:
            break
        header = text[pos:m]
        b = m + len("<|message|>")
        e, which = find_first(text, _HARMONY[2:], b)
        body = text[b:e] if e >= 0 else cut(text[b:], _HARMONY, partial)
        channel = header.partition("<|channel|>")[2].split(" ", 1)[0].split("<", 1)[0].strip()
        to = _RECIPIENT.search(header)
        if to:
            out.calls.append(ToolCall(to.group(1), body.lstrip()))
        elif channel == "analysis" and keep_analysis:
            out.content += (
                text[pos : e + len(which)] if e >= 0 else cut(text[pos:], _HARMONY, partial)
            )
        elif channel == "analysis":
            out.reasoning += body
        else:
            out.content += body
        if e < 0:
            break
        pos = e + len(which)
    return out
