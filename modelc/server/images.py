"""Images on the chat routes: each dialect's image shape in, the engine's image spans out.

:func:`image_parts` turns the images a conversation carries into the prompt format's
image parts (``{"type": "image", "data": <bytes>}``, :mod:`modelc.runtime.prompt_media`):
OpenAI ``image_url`` parts (``data:`` URLs; ``http(s)`` ones were fetched before, by
:mod:`.image_urls`, where the server allows it), Anthropic ``image`` blocks (``source.type`` ``base64``) and Responses
``input_image`` parts (both arrive here as ``image_url`` parts, their routes converting
them), and Ollama's ``images`` (base64, placed before the message's text).
:func:`place_images` decodes and encodes them on a worker thread with the engine's
vision part and puts their embeddings at the prompt's markers; a model without one
(no ``--mmproj``) gets a 400 that says so.  A broken or hostile image is one 400
(:class:`~modelc.vision.ImageError`), the server keeps serving.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import trio

from modelc.engine.api import Engine
from modelc.runtime.model import ImageSpan
from modelc.server.state import ModelInfo
from modelc.vision import ImageError, no_vision
from modelc.vision.preprocess import decode_base64, decode_data_url

MAX_IMAGES = 16  # a request's images (each one's work is the tower's whole forward)


def part_url(part: dict[str, Any]) -> Any:
    """An ``image_url`` part's URL (``image_url.url``, or ``image_url`` itself as a string;
    whatever it holds, for the caller to check)."""
    url = part.get("image_url")
    return url.get("url") if isinstance(url, dict) else url


def _url_part(part: dict[str, Any], param: str) -> dict[str, Any]:
    url = part_url(part)
    if not isinstance(url, str):
        raise ImageError("an image_url part needs image_url.url", param=param)
    if url.startswith(("http://", "https://")):
        raise ImageError(
            "image URLs are not fetched by this server; send the image inline as a data URL "
            "(data:image/png;base64,...), or start the server with --allow-image-urls",
            param=param,
        )
    return {"type": "image", "data": decode_data_url(url, param)}


def image_parts(messages: list[Any]) -> list[Any]:
    """Plain (dict) messages with every image as an image part of bytes (see the module
    docstring); ImageError for an image that is not inline base64."""
    out = []
    n = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        content = m.get("content")
        images = m.get("images")
        if images:  # Ollama: base64 images before the text
            parts = [
                {"type": "image", "data": decode_base64(str(b), f"messages[{i}].images[{k}]")}
                for k, b in enumerate(images)
            ]
            text = content if isinstance(content, str) else ""
            m = {k: v for k, v in m.items() if k != "images"}
            m["content"] = [*parts, *([{"type": "text", "text": text}] if text else [])]
            n += len(parts)
        elif isinstance(content, list):
            parts = []
            for j, p in enumerate(content):
                if isinstance(p, dict) and p.get("type") == "image_url":
                    p = _url_part(p, f"messages[{i}].content[{j}].image_url")
                    n += 1
                parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    if n > MAX_IMAGES:
        raise ImageError(f"{n} images; at most {MAX_IMAGES} a request", param="messages")
    return out


async def place_images(
    info: ModelInfo, engine: Engine, ids: list[int], media: Sequence[int], images: Sequence[bytes]
) -> tuple[list[int], tuple[ImageSpan, ...]]:
    """The prompt ``ids`` with its ``images`` placed before ``ids[media[k]]``, and their
    spans (no images: the ids as they are)."""
    if not images:
        return ids, ()
    vision = engine.vision
    if vision is None:
        raise no_vision(info.model_id)
    embeds = []
    for k, data in enumerate(images):
        embed = partial(vision.embed, data, f"image {k + 1}")
        embeds.append(await trio.to_thread.run_sync(embed))
    tok = info.fmt().tokenizer
    placed = vision.place(
        ids, media, embeds, lambda t: tok.encode(t, add_special=False, parse_special=True)
    )
    return placed.ids, placed.images
