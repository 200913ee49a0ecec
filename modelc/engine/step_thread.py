"""The scheduler's compute thread: a step starts the moment it is planned.

``trio.to_thread.run_sync`` passes through a checkpoint (its capacity limiter) before
the thread starts, and a ``trio.Lock`` another; at each, every task the last step's
tokens woke (a response rendering and writing its frame through Quart, Hypercorn and
h11) runs first, so the kernels' threads sat idle for the whole batch's HTTP work
between two steps.  :class:`StepThread` hands the call to one long-lived thread through
a queue without yielding, then parks the scheduler task until the result comes back;
the responses are written while the step computes.

Like ``to_thread.run_sync`` without ``abandon_on_cancel``, a cancelled caller still
waits for the call to end (a step is never abandoned half-way) and is cancelled at its
next checkpoint.
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import threading
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

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, report = job
            report(outcome.capture(fn))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread, started before this task yields."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        context = contextvars.copy_context()

        def report(result: outcome.Outcome[Any]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self._jobs.put((lambda: context.run(fn, *args), report))
        result: T = await trio.lowlevel.wait_task_rescheduled(
            lambda _raise_cancel: trio.lowlevel.Abort.FAILED
        )
        return result

    def close(self) -> None:
        """Let the thread end after any call it is running."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
