"""The engine's scheduler on a worker thread for ``modelc chat``: :class:`EngineThread`
runs it in one ``trio.run`` for the whole session and answers one turn at a time, Ctrl-C
in the main thread cancelling the turn (its own module so that the command line imports
trio only when a chat starts)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from modelc.errors import ModelcError, UsageError

if TYPE_CHECKING:
    from modelc.engine import LLMEngine
    from modelc.engine.api import FinishEvent, GenerationRequest


class _Turn:
    """One answer streaming in the engine's thread; ``done`` is set when it is over."""

    def __init__(self, req: GenerationRequest, out: Callable[[str], None]) -> None:
        self.req = req
        self.out = out
        self.scope = trio.CancelScope()
        self.done = threading.Event()
        self.text: list[str] = []
        self.finish: FinishEvent | None = None
        self.refused: ModelcError | None = None
        self.interrupted = False

    async def run(self, engine: LLMEngine) -> None:
        from modelc.engine.api import FinishEvent

        try:
            with self.scope:
                async with engine.submit(self.req) as handle:  # leaving it cancels the request
                    async for ev in handle:
                        if ev.text:
                            self.text.append(ev.text)
                            self.out(ev.text)
                        if isinstance(ev, FinishEvent):
                            self.finish = ev
        except ModelcError as e:  # refused at submit (a prompt too long for the context ...)
            self.refused = e
        finally:
            self.done.set()


class EngineThread:
    """The engine's scheduler in a ``trio.run`` on a worker thread, for the whole session."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._turn: _Turn | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="modelc-engine", daemon=True)

    def start(self) -> None:
        """Start the scheduler; return once it takes requests."""
        self._thread.start()
        self._ready.wait()
        self._check()

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as e:  # handed to the main thread by _check
            self._error = e
        finally:
            self._ready.set()
            if self._turn is not None:
                self._turn.done.set()

    async def _serve(self) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.engine.run)
            self._token = trio.lowlevel.current_trio_token()
            self._nursery = nursery
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def _check(self) -> None:
        if isinstance(self._error, ModelcError):
            raise self._error
        if self._error is not None:
            raise UsageError(f"the engine stopped: {self._error!r}") from self._error

    def answer(self, req: GenerationRequest, out: Callable[[str], None]) -> _Turn:
        """Run ``req``, each text piece to ``out`` as it comes; Ctrl-C (KeyboardInterrupt
        in this thread) cancels the request, and this returns once it is over."""
        nursery = self._nursery
        assert nursery is not None
        turn = self._turn = _Turn(req, out)
        self._call(nursery.start_soon, turn.run, self.engine)
        while not turn.done.is_set():
            try:
                turn.done.wait()
            except KeyboardInterrupt:
                turn.interrupted = True
                self._call(turn.scope.cancel)
        self._turn = None
        self._check()
        return turn

    def _call(self, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)`` soon in the engine's thread (this returns at once)."""
        assert self._token is not None
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:  # the engine's run is over (_check says why)
            if self._turn is not None:
                self._turn.done.set()

    def stop(self) -> None:
        """Stop the scheduler and wait for its thread."""
        if self._stop is not None:
            self._call(self._stop.set)
        self._thread.join()
