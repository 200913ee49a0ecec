"""API-key check and a per-client-address rate limit (sliding one-minute window).

Probes (``/health``, ``/metrics``, ``/api/version``) and the chat page are exempt
from both, so orchestration keeps working without credentials and under load.
"""

from __future__ import annotations

import hmac
import math
import time
from collections import deque

from modelc.server.errors import AuthError, RateLimitError

EXEMPT = frozenset({"/", "/health", "/metrics", "/api/version", "/favicon.ico"})


def check_api_key(expected: str | None, authorization: str | None, x_api_key: str | None) -> None:
    """Raise :class:`AuthError` unless the request carries ``Bearer <expected>``."""
    if not expected:
        return
    given = ""
    if authorization and authorization.lower().startswith("bearer "):
        given = authorization[7:].strip()
    elif x_api_key:
        given = x_api_key.strip()
    if not given:
        raise AuthError(
            "missing API key; send it as 'Authorization: Bearer <key>' (the server was started with --api-key)"
        )
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise AuthError("invalid API key; check the key given to --api-key")


class RateLimiter:
    """At most ``per_minute`` requests per client address in any 60-second window."""

    WINDOW = 60.0

    def __init__(self, per_minute: int) -> None:
        self.limit = per_minute
        self.hits: dict[str, deque[float]] = {}

    def check(self, client: str, now: float | None = None) -> None:
        if self.limit <= 0:
            return
        now = time.monotonic() if now is None else now
        q = self.hits.setdefault(client, deque())
        while q and q[0] <= now - self.WINDOW:
            q.popleft()
        if len(q) >= self.limit:
            retry = max(1, math.ceil(q[0] + self.WINDOW - now))
            raise RateLimitError(
                f"rate limit of {self.limit} requests per minute exceeded for {client}; "
                f"retry after {retry} s",
                retry_after=retry,
            )
        q.append(now)
        if len(self.hits) > 10_000:  # forget idle clients
            for k in [k for k, v in self.hits.items() if not v or v[-1] <= now - self.WINDOW]:
                del self.hits[k]
