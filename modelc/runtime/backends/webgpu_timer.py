"""GPU time of WebGPU jobs from timestamp queries (a profiler's tool, off by default).

Set ``Gpu.want_timestamps = True`` before the device is made (the device then asks for the
adapter's ``timestamp-query`` feature where it has one), then ``gpu.timer =
PassTimer(gpu, per_dispatch)``: each job's dispatches are encoded by :meth:`PassTimer.encode`
instead of the plain single pass, and :meth:`PassTimer.read` gives the last job's times.

- ``per_dispatch=False``: the job's one compute pass, as normal, with a timestamp at its
  start and end: the step's GPU time.
- ``per_dispatch=True``: one pass per dispatch, each timed, labelled by its pipeline
  (``module.entry``): where the GPU time goes.  Pass boundaries only add synchronisation;
  the dispatches, their order and their results are the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelc.runtime.backends.webgpu_device import record_pass

MAX_QUERIES = 4096  # WebGPU's query set limit


def timestamps_supported(gpu: Any) -> bool:
    """Whether ``gpu``'s device was made with the ``timestamp-query`` feature."""
    return "timestamp-query" in gpu.device.features


def timestamp_period(gpu: Any) -> float:
    """Nanoseconds per timestamp tick (wgpu-native's ``wgpuQueueGetTimestampPeriod``;
    1.0 where it cannot be asked)."""
    try:
        from wgpu.backends.wgpu_native._api import libf

        return float(libf.wgpuQueueGetTimestampPeriod(gpu.device.queue._internal)) or 1.0
    except Exception:
        return 1.0


class PassTimer:
    """Encodes a job's calls with timestamp writes and reads the times back (see module)."""

    def __init__(self, gpu: Any, per_dispatch: bool = False) -> None:
        if not timestamps_supported(gpu):
            raise RuntimeError("the device has no timestamp-query feature")
        self.gpu, self.per_dispatch = gpu, per_dispatch
        w = gpu.wgpu
        dev = gpu.device
        self.qs = dev.create_query_set(type=w.QueryType.timestamp, count=MAX_QUERIES)
        u = w.BufferUsage
        size = 8 * MAX_QUERIES
        self.resolved = dev.create_buffer(size=size, usage=int(u.QUERY_RESOLVE | u.COPY_SRC))
        self.readback = dev.create_buffer(size=size, usage=int(u.MAP_READ | u.COPY_DST))
        self.period = timestamp_period(gpu)
        self.labels: list[str] = []
        self.n = 0

    def _writes(self, i: int) -> dict[str, Any]:
        return {
            "query_set": self.qs,
            "beginning_of_pass_write_index": 2 * i,
            "end_of_pass_write_index": 2 * i + 1,
        }

    def encode(self, enc: Any, calls: list[tuple[Any, Any, tuple[int, int, int]]]) -> None:
        """The calls (pipeline, bind group, workgroups) into ``enc``, timed."""
        if self.per_dispatch:
            if 2 * len(calls) > MAX_QUERIES:
                raise RuntimeError(f"{len(calls)} dispatches: over {MAX_QUERIES // 2} passes")
            for i, call in enumerate(calls):
                record_pass(enc.begin_compute_pass(timestamp_writes=self._writes(i)), [call])
            self.labels = [str(getattr(c[0], "label", "") or "?") for c in calls]
        else:
            record_pass(enc.begin_compute_pass(timestamp_writes=self._writes(0)), calls)
            self.labels = ["step"]
        self.n = 2 * len(self.labels)
        enc.resolve_query_set(self.qs, 0, self.n, self.resolved, 0)
        enc.copy_buffer_to_buffer(self.resolved, 0, self.readback, 0, 8 * self.n)

    def read(self) -> list[tuple[str, float]]:
        """The last encoded job's passes: (label, GPU ns), after its submit was waited for
        (the job's own read-back waits for it)."""
        if not self.n:
            return []
        rb = self.readback
        rb.map_sync(self.gpu.wgpu.MapMode.READ, 0, 8 * self.n)
        try:
            ts = np.frombuffer(bytes(rb.read_mapped(0, 8 * self.n)), np.uint64).astype(np.int64)
        finally:
            rb.unmap()
        ns = (ts[1::2] - ts[0::2]).astype(np.float64) * self.period
        self.n = 0
        return list(zip(self.labels, ns.tolist(), strict=True))
