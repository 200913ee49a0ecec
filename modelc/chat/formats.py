"""Which output format a model speaks, read from its chat template (as llama.cpp's
``common_chat_templates_apply`` picks a parser), and the full parse of an output.

:func:`detect` names the tool-call format and the thinking-trace markers; :func:`parse`
splits an output into trace, answer and calls.  A trace is the text between the markers
at the start of the output, or from the start when the generation prompt itself opened
it (Qwen3 with thinking, DeepSeek-R1: the prompt ends with ``<think>\\n``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

import modelc.chat.calls as c
import modelc.chat.calls_xml as x
from modelc.chat.scan import ParamTypes, Parsed, cut

THINK = ("<think>", "</think>")
_NAME = re.compile(r"[\w.\-]+")  # a function's name (OpenAI: [a-zA-Z0-9_-]; built-ins: dots)


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """An output format: its name, its call parser and its trace markers (None: none)."""

    name: str
    calls: c.CallParser
    think: tuple[str, str] | None = None
    channels: bool = False  # gpt-oss: the parser splits the trace itself
    trim: bool = True  # blanks around the trace dropped (DeepSeek's parser keeps them)

    def opens_trace(self, prompt: str) -> bool:
        """True when the generation prompt ends inside an open trace."""
        if self.think is None:
            return False
        return prompt.rstrip().endswith(self.think[0].rstrip())

    def lead(self, prompt: str) -> str:
        """The open trace's marker at the prompt's end (and the blanks after it): the
        output is read as if it began with it, as llama.cpp reads the generation prompt."""
        if self.think is None or not self.opens_trace(prompt):
            return ""
        return prompt[prompt.rfind(self.think[0]) :]


def _think(src: str, markers: tuple[str, str] = THINK) -> tuple[str, str] | None:
    return markers if markers[0] in src else None


def detect(template: str | None) -> ChatFormat:
    """The output format of a model with this chat template (Hermes when unknown)."""
    s = template or ""
    if "<|channel|>" in s:
        return ChatFormat("gpt-oss", x.harmony, channels=True)
    if "[TOOL_CALLS]" in s:
        return ChatFormat("mistral", c.mistral, _think(s, ("[THINK]", "[/THINK]")))
    if ">>>all" in s:
        return ChatFormat("functionary-v3.2", c.functionary_v32)
    if "<|tool_calls_section_begin|>" in s:
        return ChatFormat("kimi-k2", c.kimi_k2, _think(s))
    if "<arg_key>" in s:
        return ChatFormat("glm-4.5", x.glm, _think(s))
    if "<|tool_call>" in s:
        return ChatFormat("gemma4", x.gemma4, _think(s, ("<|channel>thought", "<channel|>")))
    if "tool▁calls▁begin" in s:
        return ChatFormat("deepseek", c.deepseek, _think(s), trim=False)
    if "<tool_call>" in s and "<function=" in s and "<parameter=" in s:
        return ChatFormat("qwen3-coder", x.qwen3_coder, _think(s))
    if "<|tool_call|>" in s:
        return ChatFormat("granite", c.granite, _think(s))
    if "<function=" in s and "<|start_header_id|>" in s:
        return ChatFormat("functionary-v3.1", c.functionary_v31)
    if "<|start_header_id|>" in s and ("ipython" in s or "<|python_tag|>" in s):
        return ChatFormat("llama3", c.llama3)
    return ChatFormat("hermes", c.hermes, _think(s))


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def split_trace(
    text: str, markers: tuple[str, str], partial: bool, trim: bool = True
) -> tuple[str, str]:
    """(trace, rest): the trace at the start of ``text`` without its markers, and the rest
    after it (with ``trim``, both without leading blanks); no trace -> ("", text)."""
    start, end = markers
    t = text.lstrip()
    if partial and start.startswith(t):
        return "", ""
    if not t.startswith(start):
        return "", text
    s = t[len(start) :]
    i = s.find(end)
    trace, rest = (cut(s, [end], partial), "") if i < 0 else (s[:i], s[i + len(end) :])
    return (trace.lstrip(), rest.lstrip()) if trim else (trace, rest)


def trace_end(fmt: ChatFormat, text: str) -> int:
    """Where the thinking trace ``text`` starts with ends (``text`` led as :func:`parse`
    reads it): the offset just past its end marker, ``len(text)`` while it is still open,
    0 when there is none.  gpt-oss's trace is its ``analysis`` message."""
    if fmt.channels:
        start, end = "<|channel|>analysis", "<|end|>"
    elif fmt.think is not None:
        start, end = fmt.think
    else:
        return 0
    t = text.lstrip()
    if not t.startswith(start):
        return 0
    i = t.find(end, len(start))
    return len(text) if i < 0 else len(text) - len(t) + i + len(end)


def parse(
    fmt: ChatFormat,
    text: str,
    *,
    tools: bool,
    reasoning: bool = True,
    types: ParamTypes | None = None,
    partial: bool = False,
) -> Parsed:
    """The trace, answer and calls of ``text`` (the model's output after the prompt,
    led by :meth:`ChatFormat.lead` when the prompt opened the trace).

    ``tools``: whether calls are parsed (a request that offers none gets text);
    ``reasoning``: whether the trace is split off (llama.cpp's ``reasoning_format``
    ``none`` leaves it in the answer)."""
    if fmt.channels:
        out = x.harmony(text, partial, types or {}, keep_analysis=not reasoning)
        out.calls = [k for k in out.calls if tools and _NAME.fullmatch(k.name)]
        return out
    trace, rest = "", text
    if reasoning and fmt.think is not None:
        trace, rest = split_trace(text, fmt.think, partial, fmt.trim)
    if not tools:
        return Parsed(trace, rest)
    out = fmt.calls(rest, partial, types or {})
    out.calls = [k for k in out.calls if _NAME.fullmatch(k.name)]  # a name, not debris
    out.reasoning = trace
    if (partial or out.calls) and not out.content.strip():
        out.content = ""  # blanks before a call are not an answer
    return out


def _lark_regex(text: str) -> str:
    return "".join("\\" + ch if ch in r"\^$.|?*+()[]{}/-" else ch for ch in text)


def trace_grammar(fmt: ChatFormat, opened: bool, answer: str) -> str | None:
    """A Lark grammar (llguidance's) for a free thinking trace, then ``answer`` (a Lark
    rule body, e.g. ``%json {...}``): the structured output constrains the answer, not the
    trace.  The trace is one lexeme that ends at the first end marker; when the prompt
    opened it, it is required, else optional.  None for a format without trace markers
    (or channels, whose answer this does not place)."""
    if fmt.think is None or fmt.channels:
        return None
    start, end = fmt.think
    e = _lark_regex(end)
    lines = [
        "%llguidance {}",
        f"TRACE: /(.|\\n)*{e}/ & ~/(.|\\n)*{e}(.|\\n)+/",
        "WS: /[ \\t\\n]*/",
        f"answer: {answer}",
        "start: TRACE WS answer" if opened else f"start: ({json.dumps(start)} TRACE WS)? answer",
    ]
    return "\n".join(lines) + "\n"
