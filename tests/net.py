"""httpx for the tests, every client on the one SSL context (:func:`modelc.net.ssl_context`).

httpx parses certifi's CA bundle for every client it makes (~25 ms of CPU), also for the
``http://`` URLs of the tests' own servers; the polling loops and the per-request calls of
a run paid 118 CPU-s of its ~1,560 for it (py-spy, session 42).  ``net.post(...)`` is
``httpx.post(...)`` with ``verify=`` that context, and so on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from modelc.net import ssl_context


def get(url: str, **kw: Any) -> httpx.Response:
    return httpx.get(url, verify=ssl_context(), **kw)


def post(url: str, **kw: Any) -> httpx.Response:
    return httpx.post(url, verify=ssl_context(), **kw)


def head(url: str, **kw: Any) -> httpx.Response:
    return httpx.head(url, verify=ssl_context(), **kw)


def options(url: str, **kw: Any) -> httpx.Response:
    return httpx.options(url, verify=ssl_context(), **kw)


@contextmanager
def stream(method: str, url: str, **kw: Any) -> Iterator[httpx.Response]:
    with httpx.stream(method, url, verify=ssl_context(), **kw) as r:
        yield r


def client(**kw: Any) -> httpx.Client:
    return httpx.Client(verify=ssl_context(), **kw)


def openai_http() -> Any:
    """An ``openai`` client's ``http_client``: its own default client on the one context."""
    import openai

    return openai.DefaultHttpxClient(verify=ssl_context())


def anthropic_http() -> Any:
    """An ``anthropic`` client's ``http_client``: its own default client on the one context."""
    import anthropic

    return anthropic.DefaultHttpxClient(verify=ssl_context())
