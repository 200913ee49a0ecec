"""Chat templates: the model's jinja template rendered in a sandbox, or a plain fallback.

The template (GGUF ``tokenizer.chat_template`` or ``tokenizer_config.json``'s
``chat_template``) is rendered the way Hugging Face ``apply_chat_template`` does:
jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``,
the loop-controls extension, a ``tojson`` filter that does not HTML-escape, and the
globals ``raise_exception`` and ``strftime_now``.  Variables: ``messages``,
``add_generation_prompt``, ``tools``, ``bos_token``, ``eos_token`` (plus any extra
keyword the caller passes, e.g. ``documents``).

Without a template the fallback is one ``role: content`` line per message, then
``assistant:`` when a generation prompt is asked for.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from modelc.errors import UsageError

Message = Mapping[str, Any]


class TemplateError(Exception):
    """Raised by a template's own ``raise_exception``."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False
) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise UsageError(
            f"the model's chat template does not parse (line {e.lineno}): {e.message}"
        ) from e


def _check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise UsageError("a chat needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise UsageError(f"message {i} must be an object with a 'role' (and 'content')")


def plain_chat(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """The fallback rendering: ``role: content`` lines."""
    _check_messages(messages)
    lines = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
    if add_generation_prompt:
        lines.append("assistant:")
    return "\n".join(lines) + ("" if add_generation_prompt else "\n")


def render_chat(
    template: str | None,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """The prompt text for ``messages``; template problems raise :class:`UsageError`."""
    if not template:
        return plain_chat(messages, add_generation_prompt)
    _check_messages(messages)
    tpl = _compile(template)
    try:
        return tpl.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            tools=list(tools) if tools else None,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except TemplateError as e:
        raise UsageError(f"the model's chat template rejected the conversation: {e}") from e
    except jinja2.exceptions.SecurityError as e:
        raise UsageError(f"the model's chat template tried an unsafe operation: {e}") from e
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise UsageError(
            f"the model's chat template failed to render: {type(e).__name__}: {e}"
        ) from e
