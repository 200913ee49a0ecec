"""How many decode steps a scheduled batch runs (``--scheduler-steps``; 0: auto).

Between two batches the model waits for the scheduler: the step thread's report wakes
the event loop, which delivers the tokens (detokenizing, stop strings, the streams'
events) and plans the next batch, often behind the HTTP writes the last tokens woke.
On a CPU that gap is a few percent of a step; on a GPU, whose step at 64 rows takes a
few ms, it can be longer than the step itself (the GPU idle most of the time).  A batch
of K steps pays it once (:meth:`ModelRunner.execute`), at the cost of up to K - 1 steps
of waiting for a request that arrives meanwhile.

Auto picks the smallest K that makes the gap at most :data:`GAP_SHARE` of a batch,
within :data:`LATENCY_BUDGET` seconds of steps a batch (what a new request may wait, as
``--stream-interval`` auto holds a stream's tokens 20 ms) and :data:`MAX_AUTO`, from
moving averages of the measured step time and gap: 1 where the gap is small (a CPU's
steps), several on a fast device.
"""

from __future__ import annotations

import math
import time

GAP_SHARE = 0.1  # the gap's share of a batch's steps that auto aims for at most
LATENCY_BUDGET = 0.02  # seconds of steps a batch (auto): a new request waits at most this
MAX_AUTO = 8
ALPHA = 0.1  # the moving averages' weight of a new measurement


class BatchDepth:
    """The steps a batch runs: ``fixed`` (>= 1), or auto (0) from :meth:`observe`'s
    measurements."""

    def __init__(self, fixed: int) -> None:
        self.fixed = fixed
        self.step_s = 0.0  # a model step's wall time (moving average)
        self.gap_s = 0.0  # the time from one batch's end to the next one's start
        # seconds summed over batches that followed one another (/metrics): the step
        # thread's; from its end to the scheduler running again (behind the event loop's
        # HTTP work); from then to the next batch's start (delivering, planning)
        self.secs = {"step_seconds": 0.0, "wake_seconds": 0.0, "plan_seconds": 0.0}
        self._ended = self._woke = 0.0

    def observe(self, called: float, started: float, ended: float, steps: int, busy: bool) -> None:
        """A batch of ``steps`` steps ran: the scheduler handed it to the step thread at
        ``called``, which ran it from ``started`` to ``ended`` (``time.perf_counter``), and
        runs again now; ``busy``: a batch ran before it with no idle wait between (else
        the gap since says nothing)."""
        woke, step_s = time.perf_counter(), (ended - started) / steps
        self.step_s = step_s if self.step_s == 0 else self.step_s + ALPHA * (step_s - self.step_s)
        if busy:
            gap_s = called - self._ended
            self.gap_s = gap_s if self.gap_s == 0 else self.gap_s + ALPHA * (gap_s - self.gap_s)
            self.secs["plan_seconds"] += called - self._woke
        self.secs["step_seconds"] += ended - started
        self.secs["wake_seconds"] += woke - ended
        self._ended, self._woke = ended, woke

    def steps(self) -> int:
        if self.fixed:
            return self.fixed
        s, g = self.step_s, self.gap_s
        if s <= 0 or g <= GAP_SHARE * s:
            return 1
        want = math.ceil(g / (GAP_SHARE * s))
        return max(1, min(want, int(LATENCY_BUDGET / s + 1e-9), MAX_AUTO))
