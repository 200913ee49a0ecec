"""Keep-alive events for readers that wait with nothing to read (a stream's ``: ping``).

A streamed response sends a comment after some seconds without a token, so that proxies
and clients do not time out a request that waits in the queue or behind a long step.  A
timeout around each wait for the next event cost a cancel scope a wake-up (a tenth of
the stream loop's own work at 64 streams); instead the reader asks once
(``handle.keep_alive(seconds)``) and this one task of the scheduler's sends a
:class:`~modelc.engine.api.KeepAliveEvent` to each request that was sent nothing for
that long and whose reader has read everything.  It looks every quarter of the shortest
interval asked for, so an event is sent ``seconds`` to 1.25 x ``seconds`` after the last
(its ``sent_at``; a reader busy elsewhere may read two closer together).
"""

from __future__ import annotations

from collections.abc import Mapping

import trio

from modelc.engine.api import KeepAliveEvent
from modelc.engine.request import RequestState

MIN_TICK = 0.005  # seconds between looks at most


class KeepAlive:
    """The keep-alive task over the scheduler's requests (``run`` in its nursery)."""

    def __init__(self, reqs: Mapping[str, RequestState]) -> None:
        self._reqs = reqs
        self._asked = trio.Event()

    def ask(self, r: RequestState, seconds: float) -> None:
        """Keep ``r`` alive every ``seconds`` from now."""
        r.keepalive = seconds
        r.quiet_since = (r.sent, trio.current_time())
        self._asked.set()

    def tick(self, now: float) -> float | None:
        """Send the keep-alive events due at ``now``; the shortest interval asked for
        (None: nobody asks)."""
        shortest: float | None = None
        for r in self._reqs.values():
            if r.keepalive is None:
                continue
            shortest = r.keepalive if shortest is None else min(shortest, r.keepalive)
            n, since = r.quiet_since
            if r.sent != n:
                r.quiet_since = (r.sent, now)
            elif now - since >= r.keepalive and not r.send.statistics().current_buffer_used:
                r.send_event(KeepAliveEvent(sent_at=now))
                r.quiet_since = (r.sent, now)
        return shortest

    async def run(self) -> None:
        while True:
            shortest = self.tick(trio.current_time())
            if shortest is None:
                self._asked = trio.Event()
                await self._asked.wait()
            else:
                await trio.sleep(max(shortest / 4, MIN_TICK))
