"""Idle keep-alive connections are closed after ``--http-keep-alive`` seconds.

Hypercorn (0.18, trio worker) finishes a response's connection cycle (``_maybe_recycle``:
close the stream, start h11's next cycle, let the reader go on, restart the idle timer)
inside the application's task.  quart-trio cancels that task as soon as the stream's
``http.disconnect`` reaches it, which is the first step of that very cycle; the cycle is
then cut at whichever checkpoint comes next.  Cut at the idle timer's restart, the timer
never runs again and the connection stays open forever whatever ``keep_alive_timeout``
says (measured: an idle connection still open after 30 s with a 1 s timeout); cut
before h11's next cycle, the reader waits for a cycle that never starts, and the next
request on that connection is neither answered nor closed.  Which one happens depends
on the scheduler's order, so it moved with the machine's load.

:func:`install` runs that cycle under a shield, so it always completes.  The default
timeout (30 s) is longer than the idle expiry of common clients (httpx, and so the
``openai`` and ``ollama`` clients: 5 s), so they close first and do not send a request
on a connection the server is closing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.protocol.h11 import H11Protocol

DEFAULT_KEEP_ALIVE = 30.0

_original: Callable[[Any], Awaitable[None]] | None = None


async def _shielded_recycle(self: Any) -> None:
    assert _original is not None
    with trio.CancelScope(shield=True):
        await _original(self)


def install() -> None:
    """Patch Hypercorn's h11 connection cycle (once per process)."""
    global _original
    if _original is not None:
        return
    _original = H11Protocol._maybe_recycle
    H11Protocol._maybe_recycle = _shielded_recycle  # type: ignore[method-assign]
