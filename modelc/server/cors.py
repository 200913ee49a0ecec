"""Cross-origin resource sharing, as llama-server's ``--cors-origins`` does it.

A request from an allowed origin (``*``: any) gets ``Access-Control-Allow-Origin``
naming it; a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) also gets
the methods, the headers it asked for, and how long to cache the answer.  Nothing is
added for a request without ``Origin`` or from an origin not allowed (the browser then
refuses the response).  Preflights are exempt from the API key (``app.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

METHODS = "GET, POST, DELETE, OPTIONS"
EXPOSED = "X-Request-Id, Retry-After"
MAX_AGE = "600"


def headers(
    allowed: Sequence[str],
    origin: str | None,
    method: str,
    request_method: str | None,
    request_headers: str | None,
) -> dict[str, str]:
    """The CORS headers for a response to a request from ``origin`` (``method``; a
    preflight's ``Access-Control-Request-Method`` / ``-Headers``)."""
    if not origin or not allowed or ("*" not in allowed and origin not in allowed):
        return {}
    out = {"Access-Control-Allow-Origin": origin if "*" not in allowed else "*", "Vary": "Origin"}
    if method == "OPTIONS" and request_method:
        out["Access-Control-Allow-Methods"] = METHODS
        out["Access-Control-Allow-Headers"] = request_headers or "Authorization, Content-Type"
        out["Access-Control-Max-Age"] = MAX_AGE
    else:
        out["Access-Control-Expose-Headers"] = EXPOSED
    return out
