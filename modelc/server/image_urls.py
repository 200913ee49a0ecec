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

from modelc.net import ssl_context
from modelc.server.images import part_url
from modelc.vision import ImageError
from modelc.vision.preprocess import MAX_BYTES

# seconds an image's whole response may take (the variable as vLLM's VLLM_IMAGE_FETCH_TIMEOUT)
FETCH_TIMEOUT = float(os.environ.get("MODELC_IMAGE_FETCH_TIMEOUT", "10"))
MAX_REDIRECTS = 3


def remote_parts(messages: list[Any]) -> list[tuple[int, int, str]]:
    """(message, part, URL) of every ``http(s)`` image URL in plain (dict) ``messages``."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        for j, p in enumerate(content if isinstance(content, list) else []):
            url = part_url(p) if isinstance(p, dict) and p.get("type") == "image_url" else None
            if isinstance(url, str) and url.startswith(("http://", "https://")):
                out.append((i, j, url))
    return out


async def fetch_image_urls(messages: Sequence[Any], allow: bool) -> list[Any]:
    """``messages`` as plain dicts, every ``http(s)`` image URL replaced by the fetched
    image as a ``data:`` URL; ImageError when the server does not fetch URLs or a fetch
    fails."""
    out: list[Any] = msgspec.to_builtins(list(messages))
    found = remote_parts(out)
    if not found:
        return out
    i, j, _ = found[0]
    if not allow:
        raise ImageError(
            "image URLs are not fetched by this server; send the image inline as a data URL "
            "(data:image/png;base64,...), or start the server with --allow-image-urls",
            param=f"messages[{i}].content[{j}].image_url",
        )
    async with httpx.AsyncClient(
        follow_redirects=True, max_redirects=MAX_REDIRECTS, verify=ssl_context()
    ) as client:
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
