"""Chat templates: the model's jinja template rendered in a sandbox, or llama.cpp's ChatML fallback.

The template (GGUF ``tokenizer.chat_template`` or ``tokenizer_config.json``'s
``chat_template``) is rendered the way Hugging Face ``apply_chat_template`` does:
jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``,
the loop-controls extension, a ``tojson`` filter that does not HTML-escape, and the
globals ``raise_exception`` and ``strftime_now``.  Variables: ``messages``,
``add_generation_prompt``, ``tools``, ``bos_token``, ``eos_token`` (plus any extra
keyword the caller passes, e.g. ``documents``).

Without a template the fallback is ChatML (:data:`DEFAULT_TEMPLATE`), as llama.cpp's
server does for a GGUF without one, so both feed such a model the same prompt.

A template is a stranger's code: besides the sandbox (no access to internals), a render
stops with a :class:`~modelc.errors.UsageError` when it runs past
:data:`MAX_RENDER_SECONDS` (checked as ``range`` loops step), builds a string or list
over :data:`MAX_RENDER_CHARS` (``*`` and ``**`` are checked before they run, the output
as it is produced), or recurses too deep.
"""

from __future__ import annotations

import copy
import functools
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from modelc.errors import UsageError

Message = Mapping[str, Any]


MAX_RENDER_SECONDS = 2.0
MAX_RENDER_CHARS = 8 << 20  # characters (or list items) a render may build

_DEADLINE: ContextVar[float] = ContextVar("modelc_template_deadline", default=float("inf"))


class TemplateError(Exception):
    """Raised by a template's own ``raise_exception``."""


class TemplateLimit(Exception):
    """A template ran too long or built too much."""


def _check_time() -> None:
    if time.monotonic() > _DEADLINE.get():
        raise TemplateLimit(f"it ran for more than {MAX_RENDER_SECONDS:g} s")


class _Range:
    """``range`` for templates: the sandbox's bound, and the time limit at every step."""

    def __init__(self, *args: int) -> None:
        self.r = safe_range(*args)

    def __len__(self) -> int:
        return len(self.r)

    def __iter__(self) -> Iterator[int]:
        for i in self.r:
            if i % 256 == 0:
                _check_time()
            yield i


class _Env(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_time()
        if operator == "**" and isinstance(right, int | float) and abs(right) > 1024:
            raise TemplateLimit(f"it raises to the power {right}")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                sized = isinstance(seq, str | list | tuple) and isinstance(n, int)
                if sized and len(seq) * n > MAX_RENDER_CHARS:
                    raise TemplateLimit(f"it builds a sequence of {len(seq) * n} items")
        return super().call_binop(context, operator, left, right)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        # a list may grow and shrink (Kimi K2's template queues call ids), as in
        # llama.cpp's Jinja; the messages are the render's own copies
        if isinstance(obj, list) and attr in ("append", "pop"):
            return True
        return bool(super().is_safe_attribute(obj, attr, value))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_time()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, list) and len(owner) > MAX_RENDER_CHARS:
            raise TemplateLimit(f"it built a list of {len(owner)} items")
        return super().call(__context, __obj, *args, **kwargs)


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
    env = _Env(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    # no HTML here (autoescape is off): ``safe`` is the identity, as in llama.cpp's
    # Jinja, so ``"..."|safe + text`` does not escape ``text`` (Functionary v3.1)
    env.filters["safe"] = str
    env.globals["range"] = _Range
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise UsageError(
            f"the model's chat template does not parse (line {e.lineno}): {e.message}"
        ) from e


def load_template_file(path: str | Path) -> str:
    """The chat template in the file ``path`` (llama-server's ``--chat-template-file``),
    checked to parse; a :class:`UsageError` naming the file if it cannot be read or
    does not parse."""
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UsageError(f"--chat-template-file {path}: {why}") from e
    try:
        _compile(source)
    except UsageError as e:
        raise UsageError(f"--chat-template-file {path}: {e}") from e
    return source


def _check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise UsageError("a chat needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise UsageError(f"message {i} must be an object with a 'role' (and 'content')")


# llama.cpp's fallback (its CHATML_TEMPLATE_SRC) for a model that ships no template
DEFAULT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


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
    _check_messages(messages)
    tpl = _compile(template or DEFAULT_TEMPLATE)
    token = _DEADLINE.set(time.monotonic() + MAX_RENDER_SECONDS)
    try:
        parts: list[str] = []
        size = 0
        for piece in tpl.generate(
            messages=copy.deepcopy([dict(m) for m in messages]),
            add_generation_prompt=add_generation_prompt,
            tools=list(tools) if tools else None,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        ):
            size += len(piece)
            if size > MAX_RENDER_CHARS:
                raise TemplateLimit(f"its output passed {MAX_RENDER_CHARS} characters")
            _check_time()
            parts.append(piece)
        return "".join(parts)
    except TemplateLimit as e:
        raise UsageError(f"the model's chat template was stopped: {e}") from e
    except RecursionError as e:
        raise UsageError("the model's chat template recursed too deep") from e
    except TemplateError as e:
        raise UsageError(f"the model's chat template rejected the conversation: {e}") from e
    except jinja2.exceptions.SecurityError as e:
        raise UsageError(f"the model's chat template tried an unsafe operation: {e}") from e
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise UsageError(
            f"the model's chat template failed to render: {type(e).__name__}: {e}"
        ) from e
    finally:
        _DEADLINE.reset(token)
