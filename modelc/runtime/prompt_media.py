"""Images in a conversation's prompt, as llama.cpp's server and ``mtmd`` put them.

A message's content parts are text (``{"type": "text", "text": ...}``) or images
(``{"type": "image", "data": <encoded bytes>}``, made by the server from each dialect's
shape).  :func:`part_text` joins a message's parts, each image written as
:data:`MEDIA_MARKER` (llama.cpp's ``mtmd_default_marker``); :func:`images_of` lists the
images' bytes in order; :func:`encode_around` tokenizes the rendered prompt piece by
piece around the markers and says where each image goes (before which id), for the
vision part (:mod:`modelc.vision`) to put its embeddings there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from modelc.errors import UsageError

MEDIA_MARKER = "<__media__>"


def part_text(i: int, content: Sequence[Any]) -> str:
    """A message's content parts as one text: ``\\n`` between text parts, an image's
    marker right against its neighbours (as llama.cpp's server renders them)."""
    out = ""
    prev = None
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind == "image":
            out, prev = out + MEDIA_MARKER, kind
            continue
        if kind != "text" or not isinstance(part, Mapping):
            raise UsageError(
                f"messages[{i}].content[{j}] is of type {kind!r}; text and image parts are "
                "supported",
                param=f"messages[{i}].content[{j}].type",
            )
        out += ("\n" if prev == "text" else "") + str(part.get("text") or "")
        prev = kind
    return out


def images_of(messages: Sequence[Mapping[str, Any]]) -> tuple[bytes, ...]:
    """The image parts' bytes, message by message."""
    return tuple(
        bytes(p["data"])
        for m in messages
        if isinstance(m, Mapping) and isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, Mapping) and p.get("type") == "image"
    )


def encode_around(
    encode: Callable[[str], list[int]], text: str, n_images: int
) -> tuple[list[int], tuple[int, ...]]:
    """The ids of ``text`` and, per marker in it, the index of the id it stands before;
    UsageError unless there is one marker per image."""
    pieces = text.split(MEDIA_MARKER) if n_images else [text]
    if len(pieces) != n_images + 1:
        raise UsageError(
            f"the prompt has {len(pieces) - 1} image markers for {n_images} images; do not "
            f"write {MEDIA_MARKER} in text, and use a chat template that keeps every message",
            param="messages",
        )
    ids: list[int] = []
    at = []
    for k, piece in enumerate(pieces):
        if k:
            at.append(len(ids))
        ids += encode(piece) if piece else []
    return ids, tuple(at)
