"""The scheduler's step thread: a step starts before the tasks it woke run."""

from __future__ import annotations

import threading

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
