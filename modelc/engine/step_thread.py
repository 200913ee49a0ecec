"""The scheduler's compute thread: a step starts the moment it is planned.

``trio.to_thread.run_sync`` passes through a checkpoint (its capacity limiter) before
the thread starts, and a ``trio.Lock`` another; at each, every task the last step's
tokens woke (a response rendering and writing its frame through Quart, Hypercorn and
h11) runs first, so the kernels' threads sat idle for the whole batch's HTTP work
between two steps.  :class:`StepThread` hands the call to one long-lived thread through
a queue without yielding, then parks the scheduler task until the result comes back;
the responses are written while the step computes.

The call's end wakes the scheduler through a socket it waits on, not through
``run_sync_soon``: that hands the wake-up to Trio's entry-queue task, which runs in the
next batch of ready tasks and only then makes the scheduler ready for the batch after.
Each batch holds every response the last step woke, writing its frame, so the extra
hop kept the next step waiting for a whole batch of HTTP work (the GPU idle).  A
readable socket makes the scheduler ready at the I/O check right after the call ends.

Like ``to_thread.run_sync`` without ``abandon_on_cancel``, a cancelled caller still
waits for the call to end (a step is never abandoned half-way) and is cancelled at its
next checkpoint.
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")

_Job = tuple[Callable[[], Any], Callable[[outcome.Outcome[Any]], None]]


class StepThread:
    """One daemon thread running one call at a time for the Trio task that awaits it."""

    def __init__(self, name: str = "modelc-step") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None  # (read, write)
        # when the last call started and ended on the thread (perf_counter)
        self.started_at = self.ended_at = 0.0

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, report = job
            self.started_at = time.perf_counter()
            result = outcome.capture(fn)
            self.ended_at = time.perf_counter()
            report(result)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread, started before this task yields."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        if self._wake is None:
            self._wake = socket.socketpair()
            for sock in self._wake:  # a report never blocks: a full socket is readable anyway
                sock.setblocking(False)
        rd, wr = self._wake
        context = contextvars.copy_context()
        done: list[outcome.Outcome[Any]] = []

        def report(result: outcome.Outcome[Any]) -> None:
            done.append(result)
            with contextlib.suppress(OSError):  # full (read soon) or closed (nobody waits)
                wr.send(b"\0")

        self._jobs.put((lambda: context.run(fn, *args), report))
        # the call runs to its end whatever happens; every call waits at least once and
        # drains all there is: a report's byte that comes after its caller saw the result
        # (or a call that ended before its caller looked) is read by the next call, so
        # bytes never pile up in the socket
        with trio.CancelScope(shield=True):
            while True:
                await trio.lowlevel.wait_readable(rd)
                with contextlib.suppress(BlockingIOError):
                    while rd.recv(4096):
                        pass
                if done:
                    break
        result: T = done[0].unwrap()
        return result

    def close(self) -> None:
        """Let the thread end after any call it is running."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
        if self._wake is not None:
            for sock in self._wake:
                sock.close()
            self._wake = None
