"""The handle :meth:`LLMEngine.submit <modelc.engine.scheduler.LLMEngine.submit>` returns."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import trio

from modelc.engine.api import Event, FinishEvent


class Handle:
    """Async-iterate the request's events (the last is its FinishEvent); ``cancel()`` to
    stop early (leaving ``async with`` cancels too)."""

    def __init__(
        self,
        request_id: str,
        recv: trio.MemoryReceiveChannel[Event],
        cancel: Callable[[str], None],
        keep_alive: Callable[[str, float], None],
    ) -> None:
        self.request_id = request_id
        self._recv = recv
        self._cancel = cancel
        self._keep_alive = keep_alive

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        async for ev in self._recv:
            yield ev
            if isinstance(ev, FinishEvent):
                return

    async def next_event(self) -> Event:
        return await self._recv.receive()

    def event_nowait(self) -> Event | None:
        try:
            return self._recv.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return None

    def cancel(self) -> None:
        self._cancel(self.request_id)

    def keep_alive(self, seconds: float) -> None:
        self._keep_alive(self.request_id, seconds)

    async def __aenter__(self) -> Handle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()
        self._recv.close()
