"""What the event loop runs between a step's end and the scheduler's next turn.

    python -m bench.wake_trace --out trace.txt -- run MODEL --device cuda --max-concurrent 64 ...

runs ``modelc`` with these arguments (a server, say) with a Trio instrument timing every
task step, and each step's end as the scheduler learns it.  When the process exits
(a server: SIGINT or SIGTERM), ``--out`` gets, over the steps after the first third (the warm-up),
the mean time from a step's end until the scheduler's task runs again, split by the tasks
that ran in it -- by task name and, for steps over 0.3 ms, where the step stopped (the
innermost awaits): a response writing its frames (Hypercorn's send lock, the socket), a
new request's handler up to its first write, Hypercorn reading requests, ...  The
scheduler learns of a step's end only at the event loop's next I/O check, after every
task already runnable has had its step (``modelc/engine/step_thread.py``); this says
which.  Its own cost: two ``perf_counter`` calls a task step, and a frame walk for the
long ones.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import collections
import sys
import time
from pathlib import Path
from typing import Any

import trio

from modelc.engine.batch_depth import BatchDepth

LONG = 0.0003  # a task step longer than this (seconds) is named by where it stopped


class _Steps(trio.abc.Instrument):
    """(start, end, name) of every task step, and the step thread's step ends."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, float, str, str]] = []  # start, end, task, shown as
        self.ends: list[float] = []
        self._t0 = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._t0 = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        t1 = time.perf_counter()
        name = task.name.rsplit(".", 2)[-1] if "." in task.name else task.name
        if t1 - self._t0 > LONG:
            name += " @ " + ">".join(_awaits(task.coro)[-4:])
        self.steps.append((self._t0, t1, task.name, name))

    def report(self) -> str:
        """The mean wait a step (after the first third) and its split by task."""
        starts = [s[0] for s in self.steps]
        split: collections.defaultdict[str, float] = collections.defaultdict(float)
        n, total = 0, 0.0
        for e in self.ends[len(self.ends) // 3 :]:
            k = max(bisect.bisect_left(starts, e) - 1, 0)  # the task step running at e
            while k < len(self.steps):
                t0, t1, task, name = self.steps[k]
                if task.endswith("LLMEngine.run") and t0 >= e:
                    break  # the scheduler's task: its turn came
                if t1 > e:
                    split[name] += t1 - max(t0, e)
                    total += t1 - max(t0, e)
                k += 1
            n += 1
        lines = [
            f"steps {n}, from a step's end to the scheduler's turn {1000 * total / max(n, 1):.3f} ms"
        ]
        lines += [
            f"{1000 * d / max(n, 1):8.3f} ms a step  {k}"
            for k, d in sorted(split.items(), key=lambda kv: -kv[1])[:25]
        ]
        return "\n".join(lines) + "\n"


def _awaits(coro: Any) -> list[str]:
    """The names of the coroutine chain a task is suspended in, outermost first."""
    out = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        out.append(frame.f_code.co_name)
        coro = (
            getattr(coro, "cr_await", None)
            or getattr(coro, "ag_await", None)
            or getattr(coro, "gi_yieldfrom", None)
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("args", nargs=argparse.REMAINDER, help="modelc's arguments (after --)")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    ins = _Steps()

    observe = BatchDepth.observe  # the scheduler hands it each batch's end as it resumes

    def noted(
        self: BatchDepth, called: float, started: float, ended: float, steps: int, busy: bool
    ) -> None:
        ins.ends.append(ended)
        observe(self, called, started, ended, steps, busy)

    BatchDepth.observe = noted  # type: ignore[method-assign]
    real_run = trio.run

    def run(fn: Any, *rest: Any, **kw: Any) -> Any:
        kw.setdefault("instruments", []).append(ins)
        return real_run(fn, *rest, **kw)

    trio.run = run  # type: ignore[assignment]
    atexit.register(lambda: a.out.write_text(ins.report()))
    from modelc.cli import main as modelc_main

    sys.exit(modelc_main(args))


if __name__ == "__main__":
    main()
