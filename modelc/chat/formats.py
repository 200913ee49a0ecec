"""Which output format a model speaks, read from its chat template (as llama.cpp's
``common_chat_templates_apply`` picks a parser), and the full parse of an output.

:func:`detect` names the tool-call format and the thinking-trace markers; :func:`parse`
splits an output into trace, answer and calls.  A trace is the text between the markers
at the start of the output, or from the start when the generation prompt itself opened
it (Qwen3 with thinking, DeepSeek-R1: the prompt ends with ``<think>\\n``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from modelc.chat import calls as c
from modelc.chat import calls_xml as x
from modelc.chat.scan import ParamTypes, Parsed, cut

THINK = ("<think>", "</think>")


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """An output format: its name, its call parser and its trace markers (None: none)."""

    name: str
    calls: c.CallParser
    think: tuple[str, str] | None = None
    channels: bool = False  # gpt-oss: the parser splits the trace itself

    def opens_trace(self, prompt: str) -> bool:
        """True when the generation prompt ends inside an open trace."""
        if self.think is None:
            return False
        return prompt.rstrip().endswith(self.think[0].rstrip())


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
        return ChatFormat("deepseek", c.deepseek, _think(s))
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
    text: str, markers: tuple[str, str], opened: bool, partial: bool
) -> tuple[str, str]:
    """(trace, rest): the trace without its markers and leading blanks, the rest after it
    without leading blanks; no trace at the start -> ("", text)."""
    start, end = markers
    s = text
    if not opened:
        t = text.lstrip()
        if partial and start.startswith(t):
            return "", ""
        if not t.startswith(start):
            return "", text
        s = t[len(start) :]
    i = s.find(end)
    if i < 0:
        return cut(s, [end], partial).lstrip(), ""
    return s[:i].lstrip(), s[i + len(end) :].lstrip()


def parse(
    fmt: ChatFormat,
    text: str,
    *,
    tools: bool,
    reasoning: bool = True,
    opened: bool = False,
    types: ParamTypes | None = None,
    partial: bool = False,
) -> Parsed:
    """The trace, answer and calls of ``text`` (the model's output after the prompt).

    ``tools``: whether calls are parsed (a request that offers none gets text);
    ``reasoning``: whether the trace is split off (llama.cpp's ``reasoning_format``
    ``none`` leaves it in the answer); ``opened``: the prompt opened the trace."""
    if fmt.channels:
        if not reasoning:
            return Parsed(content=text)
        out = fmt.calls(text, partial, types or {})
        if not tools:
            out.content, out.calls = out.content + "".join(k.arguments for k in out.calls), []
        return out
    trace, rest = "", text
    if reasoning and fmt.think is not None:
        trace, rest = split_trace(text, fmt.think, opened, partial)
    if not tools:
        return Parsed(trace, rest)
    out = fmt.calls(rest, partial, types or {})
    out.reasoning = trace
    if partial or out.calls:
        out.content = out.content.rstrip()  # blanks before a call are not the answer's
    return out
