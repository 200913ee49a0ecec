"""A client's control-token texts kept from being parsed as control tokens (used by
:meth:`~modelc.runtime.prompt.PromptFormat.chat`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from modelc.errors import UsageError

_PRIVATE = 0xF0000  # supplementary private use area A


def strings(value: Any) -> Iterable[str]:
    """Every string in a JSON-like value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


class ControlGuard:
    """Keeps a client's control-token texts from being parsed as control tokens.

    :meth:`protect` replaces each control-token text found in a message by a private-use
    character that occurs nowhere in the conversation or the template; the tokenizer
    then splits the rendered prompt at the template's control tokens only and puts the
    originals back (``originals``) before tokenizing each text piece as text.
    """

    def __init__(self, control: Sequence[str], texts: Sequence[str], template: str) -> None:
        self.control = [t for t in control if any(t in s for s in texts)]
        used = {c for s in [*texts, template] for c in s if ord(c) >= _PRIVATE}
        free = (chr(cp) for cp in range(_PRIVATE, 0x10FFFE) if chr(cp) not in used)
        self.markers: dict[str, str] = {}
        for t in self.control:
            m = next(free, None)
            if m is None:
                raise UsageError("the conversation uses every private-use character")
            self.markers[t] = m
        self.originals = {m: t for t, m in self.markers.items()}

    def protect(self, value: Any) -> Any:
        if isinstance(value, str):
            for t in self.control:  # longest first
                if t in value:
                    value = value.replace(t, self.markers[t])
            return value
        if isinstance(value, Mapping):
            return {k: self.protect(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.protect(v) for v in value]
        return value

    def restore(self, text: str) -> str:
        for m, t in self.originals.items():
            text = text.replace(m, t)
        return text
