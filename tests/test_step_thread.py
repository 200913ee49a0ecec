"""The scheduler's step thread: a step starts before the tasks it woke run."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import outcome
import pytest
import trio
import trio.testing

from modelc.engine.step_thread import StepThread


async def test_call_starts_before_woken_tasks_run() -> None:
    """A reader woken just before a step is submitted finds the step already running.
    Through ``trio.to_thread.run_sync`` the reader runs first in about half the rounds
    (Trio reverses a batch of ready tasks at random) and waits in vain."""
    st = StepThread()
    seen: list[bool] = []
    for _ in range(8):
        started = threading.Event()
        ready = trio.Event()

        async def reader(started: threading.Event = started, ready: trio.Event = ready) -> None:
            await ready.wait()
            seen.append(started.wait(timeout=2))  # blocks the loop: the step must be going

        def step(x: int, started: threading.Event = started) -> int:
            started.set()
            return x * 2

        async with trio.open_nursery() as n:
            n.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            ready.set()  # the reader is runnable from here on
            assert await st.run(step, 21) == 42
    st.close()
    assert seen == [True] * 8


async def test_errors_come_back_and_the_thread_is_reused() -> None:
    st = StepThread()
    names: list[str] = []

    def boom() -> None:
        names.append(threading.current_thread().name)
        raise ValueError("bad step")

    with pytest.raises(ValueError, match="bad step"):
        await st.run(boom)
    with pytest.raises(ValueError, match="bad step"):
        await st.run(boom)
    st.close()
    assert names == ["modelc-step", "modelc-step"]
    assert threading.current_thread().name not in names


async def test_cancel_waits_for_the_call_then_cancels() -> None:
    """A step is never abandoned: a caller cancelled while it runs is cancelled after it
    returns, at its next checkpoint."""
    st = StepThread()
    after: list[str] = []

    def step() -> str:
        threading.Event().wait(0.3)
        return "done"

    t0 = trio.current_time()
    with trio.move_on_after(0.05) as scope:
        after.append(await st.run(step))
        await trio.sleep(10)
    st.close()
    assert scope.cancelled_caught
    assert after == ["done"]
    assert trio.current_time() - t0 >= 0.3


class _IOWaits(trio.abc.Instrument):
    """Counts the run loop's I/O checks (one between each two batches of ready tasks)."""

    def __init__(self) -> None:
        self.n = 0

    def after_io_wait(self, timeout: float) -> None:
        self.n += 1


async def test_the_caller_is_ready_at_the_io_check_after_the_call_ends() -> None:
    """A crowd of busy tasks fills every batch (4 ms of work); the caller resumes in the
    batch right after the I/O check that follows the call's end.  Woken through
    ``run_sync_soon`` it waited a batch more: Trio's entry-queue task ran in that one and
    made it ready for the next (two checks, every time)."""
    st = StepThread()
    waits = _IOWaits()
    trio.lowlevel.add_instrument(waits)
    checks: list[int] = []
    stop = False

    async def busy() -> None:  # a response writing its frame: 0.2 ms a turn (the GIL free)
        while not stop:
            time.sleep(0.0002)  # the GIL free: the step thread is not held up by it
            await trio.lowlevel.checkpoint()

    def step() -> int:
        threading.Event().wait(0.005)
        return waits.n  # read as the call ends

    async with trio.open_nursery() as n:
        for _ in range(20):
            n.start_soon(busy)
        for _ in range(12):
            at_end = await st.run(step)
            checks.append(waits.n - at_end)
        stop = True
    trio.lowlevel.remove_instrument(waits)
    st.close()
    # the end can race an I/O check that has begun but not returned: then one more
    assert sum(c <= 1 for c in checks) >= 9, checks


class _RunsAtPut:
    """A job queue that runs each job as it is put: every call ends before its caller
    looks, an interleaving the OS produces when the caller loses its core right after
    handing the job over (the thread's own ``get`` ends it at once)."""

    def put(self, job: Any) -> None:
        if job is not None:  # (None: close)
            fn, report = job
            report(outcome.capture(fn))

    def get(self) -> None:
        return None


async def test_wake_ups_never_pile_up() -> None:
    """A call that ends before its caller looks leaves its byte in the wake-up socket;
    each call waits once and drains every byte there is, so they never pile up (a full
    socket would block the thread's next report for good)."""
    st = StepThread()
    st._jobs = _RunsAtPut()  # type: ignore[assignment]
    for i in range(300):
        assert await st.run(int, i) == i
    assert st._wake is not None
    pending = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := st._wake[0].recv(4096):
            pending += chunk
    st.close()
    assert len(pending) <= 1
