"""The one SSL context modelc's HTTP clients share.

httpx builds a new context for every client it makes, also for a plain ``http://`` URL: it
parses certifi's CA bundle each time, ~25 ms of CPU.  A loop polling a starting server's
``/health`` paid that on every poll, on the cores the server was starting on: 118 CPU-s of a
test run's ~1,560 went there (py-spy, session 42).  Pass ``verify=ssl_context()`` to
``httpx.get``/``post``/``stream``/``Client``/``AsyncClient`` (and to an SDK's client through
its ``http_client``); the context is httpx's own default (certifi's bundle, or
``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when set), built once a process.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """httpx's default SSL context, made once (an ``SSLContext`` may be shared by threads)."""
    return httpx.create_ssl_context()
