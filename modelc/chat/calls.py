"""Tool-call parsers, one per output format (the trace is already split off).

Each takes the answer text, ``partial`` (see :mod:`modelc.chat.scan`) and the offered
functions' parameter types, and returns the content and the calls; formats follow
llama.cpp's ``common/chat.cpp`` and ``common/parsers/``.  A block that cannot be read
as a call stays in the content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from modelc.chat.scan import (
    ParamTypes,
    Parsed,
    ToolCall,
    call_from_obj,
    cut,
    json_end,
)

CallParser = Callable[[str, bool, ParamTypes], Parsed]

_HEAD = re.compile(
    r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,'
    r'\s*"(?:arguments|parameters)"\s*:\s*'
)


def json_call(body: str, partial: bool) -> ToolCall | None:
    """``{"name": .., "arguments": {..}}``; while partial, the arguments seen so far."""
    m = _HEAD.match(body)
    if m and m.end() < len(body) and body[m.end()] in "{[":
        s = m.end()
        e = json_end(body, s)
        try:
            name = json.loads(f'"{m.group(1)}"')
        except json.JSONDecodeError:
            return None  # a name that is not a JSON string: not a call
        return ToolCall(name, body[s:e] if e >= 0 else body[s:])
    if partial:
        return None
    try:
        return call_from_obj(json.loads(body))
    except json.JSONDecodeError:
        return None


def blocks(
    text: str,
    partial: bool,
    open_: str,
    close: str,
    read: Callable[[str, bool], list[ToolCall] | None],
) -> Parsed:
    """Calls in ``open_ body close`` blocks (the last may be unclosed); the rest is content."""
    out, parts, pos = Parsed(), [], 0
    while True:
        i = text.find(open_, pos)
        piece = cut(text[pos:], [open_], partial) if i < 0 else text[pos:i]
        if not out.calls or piece.strip():  # blanks between and after calls are dropped
            parts.append(piece)
        if i < 0:
            break
        j = text.find(close, i + len(open_)) if close else -1
        end = j if j >= 0 else len(text)
        body = text[i + len(open_) : end]
        unclosed = j < 0 and partial
        calls = read(cut(body, [close], unclosed) if close else body, unclosed)
        if calls is not None:
            out.calls += calls
        elif not unclosed:
            parts.append(text[i : end + len(close) if j >= 0 else end])
        if j < 0:
            break
        pos = j + len(close)
    out.content = "".join(parts)
    return out


def one(
    read: Callable[[str, bool], ToolCall | None],
) -> Callable[[str, bool], list[ToolCall] | None]:
    def many(body: str, partial: bool) -> list[ToolCall] | None:
        c = read(body, partial)
        return [c] if c is not None else None

    return many


def _json_list(body: str, partial: bool) -> list[ToolCall] | None:
    """A JSON array (or object) of calls, read once complete."""
    s = body.strip()
    e = json_end(s, 0) if s[:1] in ("[", "{") else -1
    if e < 0:
        return [] if partial else None
    try:
        obj = json.loads(s[:e])
    except json.JSONDecodeError:
        return None
    calls = [call_from_obj(o) for o in (obj if isinstance(obj, list) else [obj])]
    return [c for c in calls if c is not None] if all(calls) else None


def bare_json(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """The whole answer as a JSON call or list of calls (held until complete), else text."""
    s = text.strip()
    if s[:1] in ("{", "["):
        if partial:
            return Parsed()
        calls = _json_list(s, False)
        if calls and json_end(s, 0) == len(s):
            return Parsed(calls=calls)
    return Parsed(content=text)


def hermes(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """``<tool_call>{"name": .., "arguments": ..}</tool_call>`` (Hermes, Qwen2.5/3, SmolLM,
    Granite 4), or the answer as bare JSON calls."""
    if "<tool_call>" not in text and text.strip()[:1] in ("{", "["):
        return bare_json(text, partial, types)
    return blocks(text, partial, "<tool_call>", "</tool_call>", one(json_call))


_NAME = re.compile(r"[\w.\-]+")
_PY_CALL = re.compile(r"\s*([\w.]+)\.call\((.*)\)\s*$", re.S)
_KWARG = re.compile(r'(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|[^,]+)')


def _python_tag(body: str, partial: bool, offered: ParamTypes) -> ToolCall | None:
    if partial:
        return None
    s = body.strip()
    if s.startswith("{"):
        return json_call(s, False)
    m = _PY_CALL.match(s)
    if m and m.group(1) in offered:
        args = {}
        for k, v in _KWARG.findall(m.group(2)):
            try:
                args[k] = json.loads(v)
            except json.JSONDecodeError:
                args[k] = v.strip()
        return ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))
    if "python" in offered:
        return ToolCall("python", json.dumps({"code": s}, ensure_ascii=False))
    return None


def llama3(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """Llama 3.x: ``{"name": .., "parameters": ..}`` as the answer, or ``<|python_tag|>``
    followed by a JSON call, an offered built-in's ``tool.call(k="v")`` or code for an
    offered ``python`` tool (else the tag's text stays content, as llama.cpp keeps it)."""
    if "<|python_tag|>" in text:
        return blocks(
            text, partial, "<|python_tag|>", "", one(lambda b, p: _python_tag(b, p, types))
        )
    return bare_json(cut(text, ["<|python_tag|>"], partial), partial, types)


def mistral(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """``[TOOL_CALLS]name[ARGS]{..}`` (Small 3.2 adds ``[CALL_ID]id``; Ministral,
    Magistral, Devstral) or ``[TOOL_CALLS][{"name": .., "arguments": .., "id": ..}]``
    (Nemo)."""

    def read(body: str, unclosed: bool) -> list[ToolCall] | None:
        calls: list[ToolCall] = []
        for part in body.split("[TOOL_CALLS]"):
            if not part.strip():
                continue
            if part.lstrip().startswith(("[", "{")):
                got = _json_list(part, unclosed)
            else:
                got = _name_args(part, unclosed)
            if got is None:
                return calls if calls else None
            calls += got
        return calls

    return blocks(text, partial, "[TOOL_CALLS]", "", read)


def _name_args(part: str, partial: bool) -> list[ToolCall] | None:
    """``name[CALL_ID]id[ARGS]{..}`` (repeated); an unfinished one only when partial."""
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(part):
        a = part.find("[ARGS]", pos)
        if a < 0:
            return calls if partial else (calls or None)
        head = part[pos:a]
        name, _, cid = head.partition("[CALL_ID]")
        s = a + len("[ARGS]")
        while s < len(part) and part[s].isspace():
            s += 1
        e = json_end(part, s) if s < len(part) else -1
        calls.append(ToolCall(name.strip(), part[s:e] if e >= 0 else part[s:], cid.strip() or None))
        if e < 0:
            break
        pos = e
    return calls


_DS_OPEN, _DS_CALL, _DS_SEP, _DS_END = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
)


def deepseek(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """DeepSeek R1 ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{..}\\n```
    <｜tool▁call▁end｜>`` and V3.1 ``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}``, inside
    ``<｜tool▁calls▁begin｜>..<｜tool▁calls▁end｜>``."""

    def read(body: str, unclosed: bool) -> list[ToolCall] | None:
        calls = []
        for seg in body.split(_DS_CALL)[1:]:
            head, sep, rest = seg.partition(_DS_SEP)
            if not sep:
                continue
            if head.strip() == "function":  # R1
                name, nl, rest = rest.partition("\n")
                if not nl:
                    continue
                rest = rest.removeprefix("```json\n").removeprefix("```json")
            else:
                name = head
            s = rest.find("{")
            if s < 0:
                continue
            e = json_end(rest, s)
            calls.append(ToolCall(name.strip(), rest[s:e] if e >= 0 else rest[s:]))
        return calls if calls or unclosed else None

    return blocks(text, partial, _DS_OPEN, "<｜tool▁calls▁end｜>", read)


def kimi_k2(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """``<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{..}
    <|tool_call_end|>`` inside ``<|tool_calls_section_begin|>..<|tool_calls_section_end|>``."""

    def read(body: str, unclosed: bool) -> list[ToolCall] | None:
        calls = []
        for seg in body.split("<|tool_call_begin|>")[1:]:
            cid, sep, rest = seg.partition("<|tool_call_argument_begin|>")
            if not sep:
                continue
            cid = cid.strip()
            name = cid.removeprefix("functions.").rsplit(":", 1)[0]
            s = rest.find("{")
            e = json_end(rest, s) if s >= 0 else -1
            calls.append(ToolCall(name, rest[s:e] if e >= 0 else rest[max(s, 0) :], cid))
        return calls if calls or unclosed else None

    return blocks(text, partial, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", read)


def granite(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """Granite 3.x: ``<|tool_call|>[{"name": .., "arguments": ..}]``."""
    return blocks(text, partial, "<|tool_call|>", "", _json_list)


def functionary_v31(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """Functionary v3.1 (Llama 3.1): ``<function=name>{..}</function>``."""

    def read(body: str, unclosed: bool) -> ToolCall | None:
        name, gt, args = body.partition(">")
        if not gt:
            return None
        s = args.find("{")
        e = json_end(args, s) if s >= 0 else -1
        if s < 0 or (e < 0 and not unclosed):
            return None
        return ToolCall(name.strip(), args[s:e] if e >= 0 else args[s:])

    if "<|python_tag|>" in text:
        return llama3(text, partial, types)
    text = cut(text, ["<|python_tag|>"], partial)
    return blocks(text, partial, "<function=", "</function>", one(read))


def functionary_v32(text: str, partial: bool, types: ParamTypes) -> Parsed:
    """Functionary v3.2: ``recipient\\nbody`` messages joined by ``>>>`` (the prompt
    ends with the first ``>>>``); recipient ``all`` is the answer, any other a call."""
    out = Parsed()
    segs = text.split(">>>")
    for k, seg in enumerate(segs):
        last = k == len(segs) - 1
        seg = cut(seg, [">>>"], partial and last)
        name, nl, body = seg.partition("\n")
        if not nl:
            if not partial or not last:
                out.content += seg
            continue
        if name.strip() == "all":
            out.content += body
            continue
        s = body.find("{")
        e = json_end(body, s) if s >= 0 else -1
        if s >= 0 and _NAME.fullmatch(name.strip()):
            out.calls.append(ToolCall(name.strip(), body[s:e] if e >= 0 else body[s:]))
        elif not partial or not last:
            out.content += seg
    return out
