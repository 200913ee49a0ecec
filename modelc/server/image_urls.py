"""``http(s)`` image URLs on the chat routes, fetched only where the server allows it
(``modelc run --allow-image-urls``): OpenAI ``image_url`` parts, Responses
``input_image`` items and Anthropic ``url`` image sources (each route has turned them
into ``image_url`` parts by now).

A server started without the flag answers such a part with a 400 that says to send the
image inline or start the server with the flag (a server that fetches any URL a client
names reaches whatever its host can: the operator opts in).  With it, each URL is fetched
with a limit on its size (:data:`~modelc.vision.preprocess.MAX_BYTES`, as an inline
image), on the time (:data:`FETCH_TIMEOUT` seconds for the whole body) and on redirects
(:data:`MAX_REDIRECTS`, to ``http(s)`` only); whatever fails is one 400 naming the part,
and the bytes then go through the same decoding and limits as an inline image.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from typing import Any

import httpx
import msgspec
import trio

from modelc.vision import ImageError
from modelc.vision.preprocess import MAX_BYTES

# seconds an image's whole response may take (the variable as vLLM's VLLM_IMAGE_FETCH_TIMEOUT)
FETCH_TIMEOUT = float(os.environ.get("MODELC_IMAGE_FETCH_TIMEOUT", "10"))
MAX_REDIRECTS = 3


def _url(part: Any) -> str | None:
    """An ``image_url`` part's URL when it is ``http(s)``, else None."""
    if isinstance(part, dict):
        if part.get("type") != "image_url":
            return None
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
    else:
        if getattr(part, "type", None) != "image_url":
            return None
        url = getattr(getattr(part, "image_url", None), "url", None)
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def _content(message: Any) -> Any:
    return (
        message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    )


def remote_parts(messages: Sequence[Any]) -> list[tuple[int, int, str]]:
    """(message, part, URL) of every ``http(s)`` image URL in ``messages`` (Structs or
    dicts)."""
    out = []
    for i, m in enumerate(messages):
        content = _content(m)
        if isinstance(content, list):
            out += [(i, j, u) for j, p in enumerate(content) if (u := _url(p)) is not None]
    return out


async def fetch_image_urls(messages: Sequence[Any], allow: bool) -> list[Any]:
    """``messages`` with every ``http(s)`` image URL replaced by the fetched image as a
    ``data:`` URL (plain dicts then; unchanged when there is none); ImageError when the
    server does not fetch URLs or a fetch fails."""
    found = remote_parts(messages)
    if not found:
        return list(messages)
    i, j, _ = found[0]
    if not allow:
        raise ImageError(
            "image URLs are not fetched by this server; send the image inline as a data URL "
            "(data:image/png;base64,...), or start the server with --allow-image-urls",
            param=f"messages[{i}].content[{j}].image_url",
        )
    out: list[Any] = msgspec.to_builtins(list(messages))
    async with httpx.AsyncClient(follow_redirects=True, max_redirects=MAX_REDIRECTS) as client:
        for i, j, url in found:
            param = f"messages[{i}].content[{j}].image_url"
            data = await _fetch(client, url, param)
            inline = "data:image/*;base64," + base64.b64encode(data).decode()
            out[i]["content"][j] = {"type": "image_url", "image_url": {"url": inline}}
    return out


async def _fetch(client: httpx.AsyncClient, url: str, param: str) -> bytes:
    limit = f"{MAX_BYTES >> 20} MiB"
    try:
        with trio.fail_after(FETCH_TIMEOUT):
            async with client.stream("GET", url, timeout=FETCH_TIMEOUT) as r:
                if r.status_code != 200:
                    raise ImageError(f"fetching {url} gave HTTP {r.status_code}", param=param)
                size = r.headers.get("content-length", "")
                if size.isdigit() and int(size) > MAX_BYTES:
                    raise ImageError(f"the image at {url} is larger than {limit}", param=param)
                buf = bytearray()
                async for chunk in r.aiter_bytes():
                    buf += chunk
                    if len(buf) > MAX_BYTES:
                        raise ImageError(f"the image at {url} is larger than {limit}", param=param)
                return bytes(buf)
    except trio.TooSlowError as e:
        raise ImageError(
            f"the image at {url} did not arrive within {FETCH_TIMEOUT:g} s", param=param
        ) from e
    except httpx.HTTPError as e:
        raise ImageError(f"cannot fetch {url}: {e or type(e).__name__}", param=param) from e
