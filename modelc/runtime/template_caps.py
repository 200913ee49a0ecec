"""What llama.cpp's server does to a conversation before a template renders it.

``common/chat.cpp`` (``common_chat_templates_apply_jinja``) and the family adapters in
``common/parsers/`` reshape the OpenAI-style messages for some templates; the same
reshaping here keeps prompt ids equal to llama-server's for the same template:

* tool-call ``arguments`` go in as objects only when the template reads them as
  objects (llama.cpp's ``supports_object_arguments`` capability, probed by rendering);
  else as the JSON text the client sent (Functionary v3.2 concatenates them);
* an earlier turn's trace (``reasoning_content``) becomes gpt-oss's ``thinking``
  (without the content of a turn that calls tools), or Ministral 3's leading
  ``{"type": "thinking"}`` content block;
* a message's text goes in as one typed part (``[{"type": "text", "text": ...}]``) when
  the template shows text only from typed parts (SmolVLM's; llama.cpp's
  ``supports_string_content`` false, ``supports_typed_content`` true); an image stays
  its media marker in that text, as llama.cpp's server writes it;
* the variables ``date_string`` and ``datetime`` hold today's date (Llama 3.1's and
  Functionary's system prompts print it).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from modelc.errors import UsageError
from modelc.runtime.chat_template import render_chat

_PROBE_VALUE = "modelc-probe-7f3a"


def extra_context() -> dict[str, str]:
    """llama.cpp's ``common_chat_extra_context``: today's date, two ways."""
    now = time.localtime()
    return {
        "datetime": time.strftime("%b %d %Y", now),
        "date_string": time.strftime("%d %b %Y", now),
    }


@functools.lru_cache(maxsize=32)
def object_arguments(template: str | None) -> bool:
    """True when the template reads a call's arguments as an object (a probe call's
    argument value shows in its output), as llama.cpp's capability check decides."""
    if not template:
        return True
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "probe", "arguments": {"arg": _PROBE_VALUE}},
    }
    msgs: list[dict[str, Any]] = [  # llama.cpp's probe conversation (common/jinja/caps.cpp)
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ]
    params = {"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}
    fn = {"name": "probe", "description": "Tool description", "parameters": params}
    tools = [{"type": "function", "function": fn}]
    try:
        text = render_chat(template, msgs, add_generation_prompt=False, tools=tools)
    except UsageError:
        return False
    return _PROBE_VALUE in text


@functools.lru_cache(maxsize=32)
def typed_content(template: str | None) -> bool:
    """True when the template shows a message's text from typed parts but not from a
    string (a probe text rendered both ways)."""
    if not template:
        return False

    def shows(content: Any) -> bool:
        msgs = [{"role": "user", "content": content}]
        try:
            return _PROBE_VALUE in render_chat(template, msgs, add_generation_prompt=False)
        except UsageError:
            return False

    return not shows(_PROBE_VALUE) and shows([{"type": "text", "text": _PROBE_VALUE}])


def _typed(m: dict[str, Any]) -> dict[str, Any]:
    content = m.get("content")
    return {**m, "content": [{"type": "text", "text": content}]} if isinstance(content, str) else m


def _ministral_blocks(m: dict[str, Any]) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    if isinstance(m.get("reasoning_content"), str):
        blocks.append({"type": "thinking", "thinking": m["reasoning_content"]})
    content = m.get("content")
    if isinstance(content, str):
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks.extend(content)
    out = {k: v for k, v in m.items() if k != "reasoning_content"}
    out["content"] = blocks
    return out


def _gpt_oss(m: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(m.get("reasoning_content"), str):
        return m
    out = {**m, "thinking": m["reasoning_content"]}
    if m.get("tool_calls"):
        out.pop("content", None)
    return out


def _string_arguments(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if not calls:
        return m
    out = []
    for c in calls:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        out.append({**c, "function": {**fn, "arguments": args}})
    return {**m, "tool_calls": out}


def ministral3(template: str) -> bool:
    """llama.cpp's test for Ministral 3's template (its own message adapter)."""
    return (
        "[SYSTEM_PROMPT]" in template
        and "[TOOL_CALLS]" in template
        and "[ARGS]" in template
        and "[CALL_ID]" not in template
    )


def adapt(template: str | None, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as llama.cpp hands them to ``template`` (see the module docstring)."""
    src = template or ""
    out = [dict(m) for m in messages]
    if not object_arguments(template):
        out = [_string_arguments(m) for m in out]
    if typed_content(template):
        out = [_typed(m) for m in out]
    if ministral3(src):
        out = [_ministral_blocks(m) if m["role"] in ("system", "assistant") else m for m in out]
    elif "<|channel|>" in src:
        out = [_gpt_oss(m) for m in out]
    return out
